"""Padding rules of what sums over a dimension: reductions (the identity in the padding; means
and variances over the real count), softmax and its backward, matrix products.

May touch: nothing.
"""
from __future__ import annotations

import jax.numpy as jnp

from ..program import lower_call
from .core import Rule, _any, _args, _dim, _merged, mask, masked, overload_name, real


def _reduced(targs, tkw, rank, dim_arg):
    dims = tkw.get("dim", targs[dim_arg] if len(targs) > dim_arg else None)
    if dims is None or dims == ():
        return set(range(rank))
    if isinstance(dims, int):
        dims = (dims,)
    return {_dim(d, rank) for d in dims}


def reduction(fill, dim_arg=1, count=None):
    """``fill(dtype)`` is the reduction's identity; ``count``: "mean" rescales by the real
    number of elements, "var" recomputes with the real count (and correction)."""
    def check(c):
        in_kinds, out_kinds, template = c.in_kinds, c.out_kinds, c.template
        targs, tkw = template[0], dict(template[1])
        k = in_kinds[0]
        red = _reduced(targs, tkw, len(k), dim_arg)
        keep = tkw.get("keepdim", targs[dim_arg + 1] if len(targs) > dim_arg + 1 and
                       isinstance(targs[dim_arg + 1], bool) else False)
        kept = [x if i not in red else None for i, x in enumerate(k) if keep or i not in red]
        return tuple(tuple(kept) if len(o) == len(kept) else o for o in out_kinds)

    def lower(inner, vals, sizes, info):
        targs, tkw = _args(inner)
        x = vals[0]
        k = info[0][0]
        red = _reduced(targs, tkw, x.ndim, dim_arg)
        if not any(k[d] is not None for d in red):
            return lower_call(inner, vals)
        xm = masked(x, k, sizes, fill(x.dtype), red)
        out = lower_call(inner, [xm] + list(vals[1:]))
        if count is None:
            return out
        n_bound = 1
        n_real = 1
        for d in red:
            n_bound *= x.shape[d]
            n_real = n_real * real(k[d], sizes, x.shape[d])
        if count == "mean":
            o = out[0]
            return (o * (jnp.asarray(n_bound, jnp.float32) / n_real).astype(o.dtype),) + tuple(out[1:])
        raise ValueError(count)
    return Rule(check, lower)


def _var(c):
    return reduction(_zero).check(c)


def _zero(dt):
    return 0


def _var_lower(inner, vals, sizes, info):
    targs, tkw = _args(inner)
    x = vals[0]
    k = info[0][0]
    red = _reduced(targs, tkw, x.ndim, 1)
    if not any(k[d] is not None for d in red):
        return lower_call(inner, vals)
    correction = tkw.get("correction", 1)
    correction = 1 if correction is None else correction
    keep = tkw.get("keepdim", False)
    m = mask(x.shape, k, sizes, red)
    n = 1
    for d in red:
        n = n * real(k[d], sizes, x.shape[d])
    axes = tuple(sorted(red))
    xf = x.astype(jnp.float32) if x.dtype in (jnp.float16, jnp.bfloat16) else x
    mean = jnp.sum(jnp.where(m, xf, 0), axis=axes, keepdims=True) / n
    var = jnp.sum(jnp.where(m, (xf - mean) ** 2, 0), axis=axes, keepdims=keep) / jnp.maximum(n - correction, 0)
    name = overload_name(inner.func)
    if name.startswith("aten::std"):
        return jnp.sqrt(var)
    if name.startswith("aten::var_mean"):
        return var, (mean if keep else jnp.squeeze(mean, axes))
    return var


# ---------------------------------------------------------------------------------------
# Along one dimension: softmax and its backward, cumulative sums.
def _softmax_dim(inner, x, at=1):
    targs, _ = _args(inner)
    return _dim(targs[at], x.ndim)


def softmax_lower(inner, vals, sizes, info):
    x = vals[0]
    d = _softmax_dim(inner, x)
    k = info[0][0]
    if k[d] is None:
        return lower_call(inner, vals)
    return lower_call(inner, [masked(x, k, sizes, -jnp.inf, {d})] + list(vals[1:]))


def softmax_backward_lower(inner, vals, sizes, info):
    g, y = vals[0], vals[1]
    d = _softmax_dim(inner, g, 2)
    kg, ky = info[0][0], info[0][1]
    if kg[d] is None and ky[d] is None:
        return lower_call(inner, vals)
    log = overload_name(inner.func).startswith("aten::_log_softmax")
    g = masked(g, kg, sizes, 0, {d})
    y = masked(y, ky, sizes, -jnp.inf if log else 0, {d})
    return lower_call(inner, [g, y] + list(vals[2:]))


# ---------------------------------------------------------------------------------------
# Contractions: zero in the padding of every contracted dimension.
def _contract_dims(name, shapes):
    """Per operand, the dimensions summed over."""
    name = name.split(".")[0]
    last = [len(x) - 1 for x in shapes]
    table = {
        "aten::mm": lambda: [{1}, {0}],
        "aten::bmm": lambda: [{2}, {1}],
        "aten::addmm": lambda: [set(), {1}, {0}],
        "aten::baddbmm": lambda: [set(), {2}, {1}],
        "aten::addbmm": lambda: [set(), {0, 2}, {0, 1}],
        "aten::mv": lambda: [{1}, {0}],
        "aten::addmv": lambda: [set(), {1}, {0}],
        "aten::dot": lambda: [{0}, {0}],
        "aten::vdot": lambda: [{0}, {0}],
    }
    del last
    return table[name]()


def contraction(c):
    inner, in_kinds, out_kinds = c.inner, c.in_kinds, c.out_kinds
    shapes = c.in_shapes
    dims = _contract_dims(overload_name(inner.func), shapes)
    for k, ds in zip(in_kinds, dims):
        kinds = {k[d] for d in ds}
        if len(kinds) > 1 and None not in kinds:
            return "contracts dimensions padded differently"
    name = overload_name(inner.func).split(".")[0]
    bias = name.startswith("aten::add")
    a, b = in_kinds[1 if bias else 0], in_kinds[2 if bias else 1]  # the two factors
    if name in ("aten::mm", "aten::addmm"):
        got = (a[0], b[1])
    elif name in ("aten::bmm", "aten::baddbmm"):
        if a[0] != b[0]:
            return "its factors are padded differently along the batch"
        got = (a[0], a[1], b[2])
    elif name == "aten::addbmm":
        got = (a[1], b[2])
    elif name in ("aten::mv", "aten::addmv"):
        got = (a[0],)
    else:
        got = ()
    if bias and _any(in_kinds[0]):  # a bias broadcast over the product
        bias = in_kinds[0]
        for j, x in enumerate(bias):
            d = len(got) - len(bias) + j
            if x is not None and got[d] != x:
                return "its bias is padded differently from the product"
    return (_merged(out_kinds[0], got),)


def contraction_lower(inner, vals, sizes, info):
    shapes = [v.shape for v in vals]
    dims = _contract_dims(overload_name(inner.func), shapes)
    vals = list(vals)
    for i, ds in enumerate(dims):
        if ds:
            vals[i] = masked(vals[i], info[0][i], sizes, 0, ds)
    return lower_call(inner, vals)
