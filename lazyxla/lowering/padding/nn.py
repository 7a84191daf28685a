"""Padding rules of the network ops: layer norm and its backward, embeddings and indexing by
rows, ``isin``, nll losses (the padding's target is ``ignore_index``).

May touch: nothing.
"""
from __future__ import annotations

import jax.numpy as jnp

from ..program import lower_call
from .core import _any, _args, _dim, _merged, masked, overload_name, real


def layer_norm(c):
    in_kinds, out_kinds, template = c.in_kinds, c.out_kinds, c.template
    targs = template[0]
    k = in_kinds[0]
    n_norm = len(targs[1])
    if any(x is not None for x in k[len(k) - n_norm:]):
        return "normalizes over a padded dimension"
    lead = tuple(k[:len(k) - n_norm])
    return tuple(tuple(k) if len(o) == len(k) else lead + (None,) * (len(o) - len(lead)) for o in out_kinds)


def layer_norm_backward(c):
    k = c.in_kinds[0]
    n_norm = len(c.template[0][2])
    if any(x is not None for x in k[len(k) - n_norm:]):
        return "normalizes over a padded dimension"
    return tuple(tuple(k) if len(o) == len(k) and i == 0 else tuple(None for _ in o)
                 for i, o in enumerate(c.out_kinds))


def layer_norm_backward_lower(inner, vals, sizes, info):
    # grad_out, input, normalized_shape, mean, rstd, weight, bias, mask: padded rows add nothing
    # to the weight's and bias's gradients
    kinds = info[0]
    fills = [0, 0, None, 0, 1]
    vals = list(vals)
    for i, f in enumerate(fills):
        if f is not None and i < len(vals) and _any(kinds[i]):
            vals[i] = masked(vals[i], kinds[i], sizes, f)
    return lower_call(inner, vals)


def rows(c):
    """Ops that pick rows by an index: embedding (the index's kinds, then the weight's last),
    index_select and gather (the index's kinds along the dimension), embedding's backward
    (the weight's shape: not padded)."""
    if any(x is not None and x[0] == "m" for k in c.in_kinds for x in k):
        return "indexes with a merged padded dimension"
    name = overload_name(c.inner.func).split(".")[0]
    k = c.in_kinds
    if name == "aten::embedding":
        got = k[1] + (k[0][-1],)
    elif name == "aten::index_select":
        d = _dim(c.template[0][1], len(k[0]))
        got = k[0][:d] + (k[1][0],) + k[0][d + 1:]
    elif name == "aten::gather":
        got = k[1]
    else:
        got = c.out_kinds[0]
        if _any(got):
            return "makes a padded dimension"
    return (_merged(c.out_kinds[0], got),)


def index(c):
    """Advanced indexing: real index values address real positions (the real values lead);
    the output's padded dimensions come from the index tensors' or the indexed tensor's."""
    if any(x is not None and x[0] == "m" for k in c.in_kinds for x in k):
        return "indexes with a merged padded dimension"
    return c.out_kinds


def index_lower(inner, vals, sizes, info):
    targs, _ = _args(inner)
    x = vals[0]
    kx = info[0][0]
    vals = list(vals)
    slot = 1
    for d, ix in enumerate(targs[1]):
        if ix is None:
            continue
        if kx[d] is not None and jnp.issubdtype(vals[slot].dtype, jnp.integer):
            i = vals[slot]
            vals[slot] = jnp.where(i < 0, i + real(kx[d], sizes, x.shape[d]).astype(i.dtype), i)
        slot += 1
    return lower_call(inner, vals)


def isin(c):
    """isin(elements, test_elements): elementwise in ``elements``; a padded set of test
    elements would test against the padding."""
    if len(c.in_kinds) > 1 and _any(c.in_kinds[1]):
        return "tests against a padded set of elements"
    return (_merged(c.out_kinds[0], c.in_kinds[0]),)


def summed_operand(i):
    """Ops that sum operand ``i`` into rows picked by an index (embedding's backward): the
    padding of the summed operand adds nothing."""
    def lower(inner, vals, sizes, info):
        vals = list(vals)
        if _any(info[0][i]):
            vals[i] = masked(vals[i], info[0][i], sizes, 0)
        return lower_call(inner, vals)
    return lower


def nll(c):
    """nll_loss: the loss per row follows the target's kinds (reduction none); the total
    weight and a reduced loss are not padded; the input's gradient follows the input."""
    if "backward" in overload_name(c.inner.func):
        return (c.in_kinds[1],)
    targs = c.template[0]
    reduction = targs[3] if len(targs) > 3 else 1
    loss = c.in_kinds[1] if reduction == 0 else ()
    return (_merged(c.out_kinds[0], loss) if reduction == 0 else c.out_kinds[0], c.out_kinds[1])


def nll_lower(inner, vals, sizes, info):
    # the target's padding is ignore_index: no loss, no weight, no gradient
    targs, tkw = _args(inner)
    name = overload_name(inner.func)
    backward = "backward" in name
    ti = 2 if backward else 1
    si = 1 if backward else 0
    ignore = targs[5 if backward else 4] if len(targs) > (5 if backward else 4) else -100
    vals = list(vals)
    kt = info[0][ti]
    if _any(kt):
        vals[ti] = masked(vals[ti], kt, sizes, ignore)
    ks = info[0][si]
    if _any(ks):
        vals[si] = masked(vals[si], ks, sizes, 0)
    if backward and _any(info[0][0]):
        vals[0] = masked(vals[0], info[0][0], sizes, 0)
    return lower_call(inner, vals)


def cross_entropy(c):
    """lazyxla::cross_entropy and its backward: rows may be padded (the padding's target is
    ``ignore_index``), the classes may not (they are reduced over). The forward's per-row loss
    (reduction none) and row statistics follow the target's kinds, a reduced loss is not
    padded; the backward's gradient follows the logits."""
    backward = "backward" in overload_name(c.inner.func)
    kx = c.in_kinds[1 if backward else 0]
    if kx[1] is not None:
        return "reduces over a padded class dimension"
    if backward:
        return (_merged(c.out_kinds[0], tuple(kx)),)
    kt = tuple(c.in_kinds[1])
    reduction = c.template[0][2]
    loss = _merged(c.out_kinds[0], kt) if reduction == 0 else c.out_kinds[0]
    return (loss, _merged(c.out_kinds[1], kt), _merged(c.out_kinds[2], kt))


def cross_entropy_lower(inner, vals, sizes, info):
    # the padding's target is ignore_index (no loss, no count, no gradient); the padding's logits,
    # row statistics and per-row gradient are made 0, so nothing there turns into NaN.
    # Operands: forward (x, target); backward (grad, x, target, row_max, row_logsum)
    targs, _ = _args(inner)
    backward = "backward" in overload_name(inner.func)
    target, ignore = (2, targs[6]) if backward else (1, targs[3])
    vals = list(vals)
    for i, kinds in enumerate(info[0]):
        if _any(kinds):
            vals[i] = masked(vals[i], kinds, sizes, ignore if i == target else 0)
    return lower_call(inner, vals)


def refuse(why):
    def check(*_):
        return why
    return check
