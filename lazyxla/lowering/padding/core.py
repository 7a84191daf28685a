"""Padded dimensions' kinds, real sizes and masks; a rule's two halves (``Ctx``, ``Rule``);
the lowering every padded node runs (``lower_padded``); the elementwise rule.

May touch: nothing; reads ``program`` (value checks see real elements only).
"""
from __future__ import annotations

import jax.numpy as jnp

from .. import program
from ..program import lower_call

# ---------------------------------------------------------------------------------------
# Kinds, real sizes and masks.
def real(kind, sizes, bound):
    """The real size of a dimension of this kind (a traced int32 scalar, or ``bound``)."""
    if kind is None:
        return bound
    if kind[0] == "p":
        _, v, a, b = kind
        return a * sizes[v] + b
    n = 1
    for _, k in kind[1]:
        n = n * real(k, sizes, _)
    return n


def _dim_mask(kind, size, sizes):
    """A bool vector of length ``size``: which positions of a dimension of this kind are real."""
    if kind[0] == "p":
        return jnp.arange(size, dtype=jnp.int32) < real(kind, sizes, size)
    grid = None
    subs = kind[1]
    for i, (s, k) in enumerate(subs):
        m = jnp.ones((s,), bool) if k is None else _dim_mask(k, s, sizes)
        shape = [1] * len(subs)
        shape[i] = s
        m = m.reshape(shape)
        grid = m if grid is None else grid & m
    return jnp.broadcast_to(grid, tuple(s for s, _ in subs)).reshape(-1)


def mask(shape, kinds, sizes, dims=None):
    """Bool array broadcastable to ``shape``: true where every padded dimension (of ``dims``,
    default all) is real; None when none is padded."""
    out = None
    for d, k in enumerate(kinds):
        if k is None or (dims is not None and d not in dims):
            continue
        m = _dim_mask(k, shape[d], sizes)
        m = m.reshape([shape[d] if i == d else 1 for i in range(len(shape))])
        out = m if out is None else out & m
    return out


def masked(x, kinds, sizes, fill, dims=None):
    """``x`` with ``fill`` wherever a padded dimension (of ``dims``) is padding."""
    if x is None or not hasattr(x, "shape"):
        return x
    m = mask(x.shape, kinds, sizes, dims)
    return x if m is None else jnp.where(m, x, jnp.asarray(fill, x.dtype))


def _lowest(dt):
    return -jnp.inf if jnp.issubdtype(dt, jnp.floating) else (
        False if dt == jnp.bool_ else jnp.iinfo(dt).min)


def _highest(dt):
    return jnp.inf if jnp.issubdtype(dt, jnp.floating) else (
        True if dt == jnp.bool_ else jnp.iinfo(dt).max)


def _padded(k):
    return k is not None


def _any(kinds):
    return any(_padded(k) for k in kinds)


def _dim(d, rank):
    return d + rank if d < 0 else d


def _args(inner):
    targs, tkw = inner.template
    return targs, dict(tkw)


class Ctx:
    """What a rule's check sees of one node: ``inner`` (the op's signature at the bounds),
    ``in_kinds``/``in_shapes`` per operand, ``out_kinds`` (from the sizes), ``moving`` (template
    integer index -> (variable, a, b)), ``template`` (the exact graph's)."""
    __slots__ = ("inner", "in_kinds", "out_kinds", "moving", "template", "in_shapes")

    def __init__(self, inner, in_kinds, out_kinds, moving, template, in_shapes):
        self.inner, self.in_kinds, self.out_kinds = inner, in_kinds, out_kinds
        self.moving, self.template, self.in_shapes = moving, template, in_shapes

    def but(self, **kw):
        c = Ctx(self.inner, self.in_kinds, self.out_kinds, self.moving, self.template, self.in_shapes)
        for k, v in kw.items():
            setattr(c, k, v)
        return c


class Rule:
    """How one op family is padded: ``check`` once per graph, ``lower`` at trace time.
    ``sizes``: the rule reads template integers that follow a size (``Ctx.moving``: a view's
    sizes, a slice's bounds); for any other rule such an integer refuses the node before its
    check runs (``dynamic``), since the op would take it for a plain number."""

    def __init__(self, check, lower=None, sizes=False):
        self.check = check
        self.lower = lower or _plain
        self.sizes = sizes


def _plain(inner, vals, sizes, info):
    return lower_call(inner, vals)


def lower_padded(sig, *vals, info=None, inner=None):
    """The lowering of a padded node (``dynamic.PaddedSig``): its rule around the op's own
    lowering. While it runs, value checks see only the real elements of its operands."""
    n = sig.info[3]
    ops, sizes = list(vals[:n]), vals[n:]
    in_kinds = sig.info[0]
    masks = [mask(v.shape, k, sizes) if hasattr(v, "shape") and _any(k) else None for v, k in zip(ops, in_kinds)]
    was = program.set_valid([(v.shape, m) for v, m in zip(ops, masks) if m is not None])
    try:
        return sig.rule.lower(sig.inner, ops, sizes, sig.info)
    finally:
        program.set_valid(was)


# ---------------------------------------------------------------------------------------
# Family checks.
def _broadcast_kinds(in_kinds, out_kinds):
    """Elementwise: every operand's padded dimension lines up with the output's (right
    aligned); merged kinds flow through."""
    out = [list(k) for k in out_kinds]
    for ok in out:
        r = len(ok)
        for ik in in_kinds:
            for j, k in enumerate(ik):
                d = r - len(ik) + j
                if k is None or d < 0:
                    continue
                if ok[d] is None or (ok[d][0] == "p" and k[0] == "m"):
                    ok[d] = k
                elif ok[d] != k:
                    return "its operands are padded differently along one dimension"
    return tuple(tuple(k) for k in out)


def pointwise(c):
    return _broadcast_kinds(c.in_kinds, c.out_kinds)


def _merged(fit, got):
    """Output kinds: what the operands' kinds say, else what the sizes say (a dimension made
    from sizes: factories, expand)."""
    return tuple(g if g is not None else f for f, g in zip(fit, got))


def _count_ints(x):
    t = type(x)
    if t is int:
        return 1
    if t is tuple or t is list:
        return sum(_count_ints(y) for y in x)
    return 0


def overload_name(f) -> str:
    """``aten::sum.dim_IntList``; ``aten::addmm.default`` (where ``f.name()`` says ``aten::addmm``)."""
    return f"{f._schema.name}.{f._overloadname}"
