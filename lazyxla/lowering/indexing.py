"""Indexing with index tensors as JAX functions: index_select, gather, advanced indexing
(``index.Tensor``), scatter (set, add, legacy reduce), index_put (with integer or boolean
indices), index_add, index_copy and index_fill, masked_scatter and its backward,
scatter_reduce and index_reduce (sum, prod, amax, amin, mean), take and put (flat
indices), segment_reduce and its backward, nonzero_static.

Every output has a static shape: a boolean index or mask writes through a running count of
the mask. Every index is checked against its dimension inside the program
(``program.check_index``): out of bounds raises as PyTorch does, once the program ran. Ops
whose output shape depends on the data (``nonzero``, ``masked_select``,
``unique``) are not here: they stay CPU fallbacks on purpose (docs/coverage.md). Touches only
the registry.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .program import check_index, report
from ..xla.widths import long_dtype
from .registry import register


def _oob(d, n) -> str:
    """PyTorch's message for an index out of bounds (``{value}``: the index)."""
    return f"index {{value}} is out of bounds for dimension {d} with size {n}"


def _out_of_range(d, n) -> str:
    """PyTorch's message where it names no index (index_select, embedding), with what it omits."""
    return f"index out of range in self (index {{value}}, dimension {d} of size {n})"


@register("index_select.default", zero_d="index")
def _index_select(sig, x, dim, index):
    d = dim % max(x.ndim, 1)
    check_index(index, x.shape[d] if x.ndim else 1, _out_of_range(d, x.shape[d] if x.ndim else 1), "IndexError")
    return jnp.take(x, index, axis=d)


@register("_unsafe_index.Tensor", "index.Tensor")
def _index(sig, x, indices):
    # Advanced indexing with a list of optional index tensors (None keeps the dim).
    idx = tuple(slice(None) if i is None else (i if i.dtype != jnp.bool_ else i) for i in indices)
    _check_indices(x, indices)
    return x[idx]


def _check_indices(x, indices):
    """Advanced indexing: each integer index tensor within its dimension (negative from the end)."""
    for d, i in enumerate(indices):
        if i is not None and i.dtype != jnp.bool_ and d < x.ndim:
            check_index(i, x.shape[d], _oob(d, x.shape[d]), "IndexError", negative=True)


@register("gather.default", zero_d="index")
def _gather(sig, x, dim, index, sparse_grad=False):
    d = dim % max(x.ndim, 1)
    check_index(index, x.shape[d] if x.ndim else 1, _oob(d, x.shape[d] if x.ndim else 1))
    # the index may be smaller than the input in the other dims: PyTorch reads only that corner
    x = x[tuple(slice(None) if a == d else slice(0, n) for a, n in enumerate(index.shape))]
    return jnp.take_along_axis(x, index, axis=d)


# -- scatter -------------------------------------------------------------------------------
def _add_at(x, idx, v):
    """``x`` with ``v`` added at ``idx``; for bool a logical or, as PyTorch's bool sum (XLA's
    scatter-add refuses bool)."""
    return x.at[idx].max(v) if x.dtype == jnp.bool_ else x.at[idx].add(v)


def _mul_at(x, idx, v):
    """``x`` with ``v`` multiplied in at ``idx``; for bool a logical and."""
    return x.at[idx].min(v) if x.dtype == jnp.bool_ else x.at[idx].multiply(v)


def _scatter_idx(x, dim, index):
    d = dim % max(x.ndim, 1)
    check_index(index, x.shape[d] if x.ndim else 1, _oob(d, x.shape[d] if x.ndim else 1))
    grids = list(jnp.meshgrid(*[jnp.arange(n) for n in index.shape], indexing="ij"))
    grids[d] = index
    return tuple(grids)


@register("scatter.src", "scatter.value", zero_d="all")
def _scatter(sig, x, dim, index, src):
    idx = _scatter_idx(x, dim, index)
    if hasattr(src, "shape") and src.ndim:
        src = src[tuple(slice(0, n) for n in index.shape)]
    return x.at[idx].set(jnp.asarray(src, x.dtype))


@register("scatter.reduce", "scatter.value_reduce", zero_d="all")
def _scatter_reduce_legacy(sig, x, dim, index, src, reduce):
    idx = _scatter_idx(x, dim, index)
    if hasattr(src, "shape") and src.ndim:
        src = src[tuple(slice(0, n) for n in index.shape)]
    src = jnp.asarray(src, x.dtype)
    return _add_at(x, idx, src) if reduce == "add" else _mul_at(x, idx, src)


@register("scatter_add.default", zero_d="all")
def _scatter_add(sig, x, dim, index, src):
    idx = _scatter_idx(x, dim, index)
    return _add_at(x, idx, src[tuple(slice(0, n) for n in index.shape)].astype(x.dtype))


@register("index_put.default", "_unsafe_index_put.default")
def _index_put(sig, x, indices, values, accumulate=False):
    if any(i is not None and i.dtype == jnp.bool_ for i in indices):
        return _index_put_mask(x, indices, values, accumulate)
    idx = tuple(slice(None) if i is None else i for i in indices)
    _check_indices(x, indices)
    v = jnp.asarray(values, x.dtype)
    return _add_at(x, idx, v) if accumulate else x.at[idx].set(v)


def _index_put_mask(x, indices, values, accumulate):
    """``x[mask] = values`` with a static shape: the k-th True element of the mask takes
    the k-th value (found by a running count of the mask), the others keep x."""
    pos = [d for d, i in enumerate(indices) if i is not None]
    if len(pos) != 1:
        raise NotImplementedError("aten::index_put: a boolean mask index combined with other index "
                                  "tensors is not supported by lazyxla")
    d = pos[0]
    m = indices[d]
    pre, post = x.shape[:d], x.shape[d + m.ndim:]
    n = int(np.prod(m.shape, dtype=np.int64))
    xr = x.reshape(pre + (n,) + post)
    mf = m.reshape(n)
    v = jnp.asarray(values, x.dtype)
    k = v.shape[-(len(post) + 1)] if v.ndim > len(post) else 1
    v = jnp.broadcast_to(v, pre + (k,) + post)
    count = jnp.cumsum(mf.astype(long_dtype()))
    if k != 1:  # k values for the mask's True elements: their number must be k
        shape = ", ".join(str(s) for s in jnp.shape(values))
        report(count[-1] != k, count[-1], f"shape mismatch: value tensor of shape [{shape}] cannot be broadcast to "
               "indexing result of shape [{value}" + "".join(f", {s}" for s in post) + "]")
    which = jnp.clip(count - 1, 0, k - 1)
    picked = jnp.take(v, which, axis=len(pre))
    keep = mf.reshape((1,) * len(pre) + (n,) + (1,) * len(post))
    new = jnp.where(keep, xr + picked if accumulate else picked, xr)
    return new.reshape(x.shape)


@register("index_add.default", zero_d="all")
def _index_add(sig, x, dim, index, source, alpha=1):
    d = dim % max(x.ndim, 1)
    check_index(index, x.shape[d], _oob(d, x.shape[d]))
    idx = [slice(None)] * x.ndim
    idx[d] = index
    return _add_at(x, tuple(idx), (source * alpha).astype(x.dtype))


@register("index_fill.int_Scalar", "index_fill.int_Tensor", zero_d="index")
def _index_fill(sig, x, dim, index, value):
    """The slices ``index`` names along ``dim`` set to ``value`` (negative indices count from
    the end)."""
    d = dim % max(x.ndim, 1)
    check_index(index, x.shape[d], _oob(d, x.shape[d]), "IndexError", negative=True)
    idx = [slice(None)] * x.ndim
    idx[d] = jnp.where(index < 0, index + x.shape[d], index)
    return x.at[tuple(idx)].set(jnp.asarray(value).astype(x.dtype))


@register("index_copy.default", zero_d="all")
def _index_copy(sig, x, dim, index, source):
    d = dim % max(x.ndim, 1)
    check_index(index, x.shape[d], "index_copy_(): " + _oob(d, x.shape[d]), "IndexError")
    idx = [slice(None)] * x.ndim
    idx[d] = index
    return x.at[tuple(idx)].set(source.astype(x.dtype))


# -- scatters that count or reduce -----------------------------------------------------
@register("masked_scatter.default")
def masked_scatter(sig, x, mask, source):
    """The k-th True element of the (broadcast) mask takes the k-th element of source."""
    shape = tuple(sig.outs[0].shape)
    flat = jnp.broadcast_to(x, shape).reshape(-1)
    m = jnp.broadcast_to(mask, shape).reshape(-1)
    src = source.reshape(-1).astype(x.dtype)
    count = jnp.cumsum(m.astype(long_dtype()))
    if m.size:
        report(count[-1] > src.size, count[-1], "Number of elements of source < number of ones in mask "
               f"({{value}} ones, {src.size} elements)")
    if src.size == 0:
        return flat.reshape(shape)
    k = jnp.clip(count - 1, 0, src.size - 1)
    return jnp.where(m, src[k], flat).reshape(shape)


@register("masked_scatter_backward.default")
def masked_scatter_backward(sig, grad, mask, sizes):
    """The source's gradient: the gradient at the True elements of the mask, in order, then
    zeros, shaped ``sizes``."""
    flat = grad.reshape(-1)
    m = jnp.broadcast_to(mask, grad.shape).reshape(-1)
    n = int(np.prod(sizes, dtype=np.int64))
    k = jnp.where(m, jnp.cumsum(m.astype(long_dtype())) - 1, n)
    return jnp.zeros((n,), grad.dtype).at[k].set(flat, mode="drop").reshape(tuple(sizes))


def _extreme(dtype, high):
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.inf if high else -jnp.inf
    if dtype == jnp.bool_:
        return high
    info = jnp.iinfo(dtype)
    return info.max if high else info.min


@register("scatter_reduce.two")
def scatter_reduce(sig, x, dim, index, src, reduce, include_self=True):
    if index.size == 0:
        return x
    if x.ndim == 0:
        return scatter_reduce(sig, x.reshape(1), 0, index.reshape(1), src.reshape(1), reduce,
                              include_self).reshape(())
    idx = _scatter_idx(x, dim, index)
    src = src[tuple(slice(0, n) for n in index.shape)].astype(x.dtype)
    if reduce == "sum":
        base = x if include_self else x.at[idx].set(jnp.zeros((), x.dtype))
        return _add_at(base, idx, src)
    if reduce == "prod":
        base = x if include_self else x.at[idx].set(jnp.ones((), x.dtype))
        return _mul_at(base, idx, src)
    if reduce == "amax":
        base = x if include_self else x.at[idx].set(_extreme(x.dtype, False))
        return base.at[idx].max(src)
    if reduce == "amin":
        base = x if include_self else x.at[idx].set(_extreme(x.dtype, True))
        return base.at[idx].min(src)
    if reduce == "mean":
        base = x if include_self else x.at[idx].set(jnp.zeros((), x.dtype))
        total = base.at[idx].add(src)
        count = (jnp.ones(x.shape, long_dtype()) if include_self else jnp.zeros(x.shape, long_dtype())
                 ).at[idx].add(1)
        count = jnp.maximum(count, 1)
        if jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.complexfloating):
            return total / count.astype(x.dtype)
        return jnp.floor_divide(total, count.astype(x.dtype))
    raise NotImplementedError(f"aten::scatter_reduce: reduce={reduce!r}")


@register("index_reduce.default")
def index_reduce(sig, x, dim, index, source, reduce, include_self=True):
    """``x`` with ``source``'s slices reduced into the slices ``index`` names along ``dim``;
    without ``include_self`` the named slices start from the reduction's identity. A mean
    divides by the count (floor division for integers, as PyTorch)."""
    if x.ndim == 0:
        return index_reduce(sig, x.reshape(1), 0, index.reshape(1), source.reshape(1), reduce,
                            include_self).reshape(())
    d = dim % x.ndim
    check_index(index, x.shape[d], _out_of_range(d, x.shape[d]), "IndexError")
    xm = jnp.moveaxis(x, d, 0)
    src = jnp.moveaxis(source, d % max(source.ndim, 1), 0).astype(x.dtype) if source.ndim else \
        source.reshape(1).astype(x.dtype)
    identity = {"prod": 1, "mean": 0, "amax": _extreme(x.dtype, False), "amin": _extreme(x.dtype, True)}[reduce]
    base = xm if include_self else xm.at[index].set(identity)
    if reduce == "prod":
        out = base.at[index].multiply(src)
    elif reduce == "amax":
        out = base.at[index].max(src)
    elif reduce == "amin":
        out = base.at[index].min(src)
    else:
        total = base.at[index].add(src)
        count = jnp.full(xm.shape[:1], 1 if include_self else 0, long_dtype()).at[index].add(1)
        count = jnp.maximum(count, 1).reshape((-1,) + (1,) * (xm.ndim - 1)).astype(x.dtype)
        if jnp.issubdtype(x.dtype, jnp.inexact):
            out = total / count
        else:
            out = jnp.floor_divide(total, count)
    return jnp.moveaxis(out, 0, d)


def _check_flat(index, n):
    check_index(index, n, f"out of range: tried to access index {{value}} on a tensor of {n} elements.", "IndexError",
                negative=True)


def _flat_index(index, n):
    return jnp.where(index < 0, index + n, index).reshape(-1)


@register("take.default")
def take(sig, x, index):
    """Elements of ``x`` by index into its flattened self (negative counts from the end)."""
    flat = x.reshape(-1)
    _check_flat(index, flat.shape[0])
    return flat[_flat_index(index, flat.shape[0])].reshape(index.shape)


@register("put.default")
def put(sig, x, index, source, accumulate=False):
    """``x``'s flattened self with ``source`` written (or added) at ``index``; of repeated
    indices the last write wins, as PyTorch's CPU kernel writes in order."""
    flat = x.reshape(-1)
    n = flat.shape[0]
    _check_flat(index, n)
    idx = _flat_index(index, n)
    src = source.reshape(-1).astype(x.dtype)
    if accumulate:
        return _add_at(flat, idx, src).reshape(x.shape)
    last = jnp.full((n,), -1, long_dtype()).at[idx].max(jnp.arange(idx.shape[0], dtype=long_dtype()))
    return jnp.where(last >= 0, src[jnp.maximum(last, 0)], flat).reshape(x.shape)


@register("nonzero_static.default")
def nonzero_static(sig, x, size, fill_value=-1):
    """The first ``size`` coordinates of nonzero elements in row-major order, the rest
    ``fill_value``: a static shape (``nonzero`` itself stays on the CPU)."""
    if x.ndim == 0:
        return jnp.zeros((size, 0), long_dtype())
    coords = jnp.nonzero(x, size=size, fill_value=fill_value)
    return jnp.stack(coords, axis=1).astype(long_dtype())


# -- segment_reduce ------------------------------------------------------------------------
# PyTorch reduces along the last dim of ``lengths`` (offsets: one more), whatever ``axis``
# says; the dims before it are batch dims shared by data and lengths.
def _segments(data, lengths, offsets):
    """(axis, data as [B, N, inner], segment of each position [B, N], valid [B, N], segment
    lengths [B, S])."""
    seg_spec = lengths if lengths is not None else offsets
    axis = seg_spec.ndim - 1
    lead = data.shape[:axis]
    b = int(np.prod(lead, dtype=np.int64))
    n = data.shape[axis]
    d = data.reshape((b, n) + data.shape[axis + 1:])
    if lengths is not None:
        ln = lengths.reshape(b, -1).astype(long_dtype())
        end = jnp.cumsum(ln, axis=1)
        start = end - ln
    else:
        off = offsets.reshape(b, -1).astype(long_dtype())
        start, end = off[:, :-1], off[:, 1:]
        ln = end - start
    pos = jnp.arange(n, dtype=long_dtype())
    seg = jax.vmap(lambda st: jnp.searchsorted(st, pos, side="right") - 1)(start)
    segc = jnp.clip(seg, 0, ln.shape[1] - 1)
    valid = (seg >= 0) & (pos[None, :] < jnp.take_along_axis(end, segc, axis=1))
    return axis, d, segc, valid, ln


def _bcast(m, like):
    """A [B, N] mask or index broadcast over the inner dims of ``like`` [B, N, ...]."""
    return m.reshape(m.shape + (1,) * (like.ndim - 2))


@register("segment_reduce.default")
def segment_reduce(sig, data, reduce, lengths=None, indices=None, offsets=None, axis=0, unsafe=False,
                   initial=None):
    ax, d, seg, valid, ln = _segments(data, lengths, offsets)
    s = ln.shape[1]
    dt = d.dtype
    ident = {"max": -jnp.inf, "min": jnp.inf, "mean": 0, "sum": 0, "prod": 1}[reduce]
    init = jnp.asarray(ident if initial is None else initial, dt)
    v = _bcast(valid, d)

    def per_batch(x, sg, vm):
        if reduce in ("sum", "mean"):
            return jax.ops.segment_sum(jnp.where(vm, x, 0), sg, s)
        if reduce == "prod":
            return jax.ops.segment_prod(jnp.where(vm, x, 1), sg, s)
        pick = jax.ops.segment_max if reduce == "max" else jax.ops.segment_min
        r = pick(jnp.where(vm, x, ident), sg, s)   # NaN-propagating, as PyTorch's loop
        has_nan = jax.ops.segment_max(vm & jnp.isnan(x), sg, s)
        return jnp.where(has_nan, jnp.nan, r)

    r = jax.vmap(per_batch)(d, seg, v)
    lnb = _bcast(ln, r).astype(dt)
    if reduce in ("sum", "mean"):
        r = init + r
    elif reduce == "prod":
        r = init * r
    elif reduce == "max":
        r = jnp.where(jnp.isnan(init), init, jnp.maximum(init, r))
    else:
        r = jnp.where(jnp.isnan(init), init, jnp.minimum(init, r))
    if reduce == "mean":
        empty = lnb == 0
        r = jnp.where(empty, jnp.nan if initial is None else r, jnp.where(jnp.isnan(r), r, r / jnp.maximum(lnb, 1)))
    return r.reshape(data.shape[:ax] + (s,) + data.shape[ax + 1:])


@register("_segment_reduce_backward.default")
def segment_reduce_backward(sig, grad, output, data, reduce, lengths=None, offsets=None, axis=0,
                            initial=None):
    """PyTorch's CPU rules: max/min send the gradient to every element equal to the result
    (and every NaN), dividing the positive ones by their count; prod divides the result by
    each element, or multiplies the others (and ``initial``) for a zero or NaN element."""
    ax, d, seg, valid, ln = _segments(data, lengths, offsets)
    s = ln.shape[1]
    gb = grad.reshape(d.shape[:1] + (s,) + d.shape[2:])
    ob = output.reshape(gb.shape)
    take = lambda t: jax.vmap(lambda a, i: a[i])(t, seg)
    g, o = take(gb), take(ob)
    v = _bcast(valid, d)
    if reduce == "sum":
        gi = g
    elif reduce == "mean":
        gi = g / _bcast(take(ln), d).astype(d.dtype)
    elif reduce in ("max", "min"):
        hit = v & (jnp.isnan(d) | (d == o))
        count = jax.vmap(lambda h, sg: jax.ops.segment_sum(h.astype(long_dtype()), sg, s))(hit, seg)
        c = take(count).astype(d.dtype)
        gi = jnp.where(hit, g, 0)
        gi = jnp.where(hit & (c >= 2) & (gi > 0), gi / jnp.maximum(c, 1), gi)
    else:
        init = jnp.asarray(1 if initial is None else initial, d.dtype)
        x1 = jnp.where(v, d, 1)
        before = _exclusive(x1, seg, False)
        after = _exclusive(x1, seg, True)
        special = jnp.isnan(d) | (d == 0)
        gi = jnp.where(special, g * (init * before * after), g * o / jnp.where(special, 1, d))
    gi = jnp.where(v, gi, 0)
    return gi.reshape(data.shape)


def _exclusive(x, seg, reverse):
    """Per element, the product of the other elements of its segment before it (or after it)."""
    segb = jnp.broadcast_to(_bcast(seg, x), x.shape)

    def combine(a, b):
        (sa, pa), (sb, pb) = a, b
        return sb, jnp.where(sa == sb, pa * pb, pb)

    _, inc = jax.lax.associative_scan(combine, (segb, x), axis=1, reverse=reverse)
    # inclusive -> exclusive: divide out x itself is unsafe (zeros): shift by one instead
    shift = (lambda t, fill: jnp.concatenate([t[:, 1:], fill], axis=1)) if reverse else \
        (lambda t, fill: jnp.concatenate([fill, t[:, :-1]], axis=1))
    one = jnp.ones_like(x[:, :1])
    prev = shift(inc, one)
    prev_seg = shift(segb, jnp.full_like(segb[:, :1], -1))
    return jnp.where(prev_seg == segb, prev, 1)
