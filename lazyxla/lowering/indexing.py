"""Indexing with index tensors as JAX functions: index_select, gather, advanced indexing
(``index.Tensor``), scatter (set, add, legacy reduce), index_put (with integer or boolean
indices), index_add and index_copy, masked_scatter and scatter_reduce (sum, prod, amax,
amin, mean).

Every output has a static shape: a boolean index or mask writes through a running count of
the mask. Ops whose output shape depends on the data (``nonzero``, ``masked_select``,
``unique``) are not here: they stay CPU fallbacks on purpose (docs/coverage.md). Touches only
the registry.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .registry import register


@register("index_select.default", zero_d="index")
def _index_select(sig, x, dim, index):
    return jnp.take(x, index, axis=dim % max(x.ndim, 1))


@register("_unsafe_index.Tensor", "index.Tensor")
def _index(sig, x, indices):
    # Advanced indexing with a list of optional index tensors (None keeps the dim).
    idx = tuple(slice(None) if i is None else (i if i.dtype != jnp.bool_ else i) for i in indices)
    return x[idx]


@register("gather.default", zero_d="index")
def _gather(sig, x, dim, index, sparse_grad=False):
    d = dim % max(x.ndim, 1)
    # the index may be smaller than the input in the other dims: PyTorch reads only that corner
    x = x[tuple(slice(None) if a == d else slice(0, n) for a, n in enumerate(index.shape))]
    return jnp.take_along_axis(x, index, axis=d)


# -- scatter -------------------------------------------------------------------------------
def _scatter_idx(x, dim, index):
    d = dim % max(x.ndim, 1)
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
    return x.at[idx].add(src) if reduce == "add" else x.at[idx].multiply(src)


@register("scatter_add.default", zero_d="all")
def _scatter_add(sig, x, dim, index, src):
    idx = _scatter_idx(x, dim, index)
    return x.at[idx].add(src[tuple(slice(0, n) for n in index.shape)].astype(x.dtype))


@register("index_put.default", "_unsafe_index_put.default")
def _index_put(sig, x, indices, values, accumulate=False):
    if any(i is not None and i.dtype == jnp.bool_ for i in indices):
        return _index_put_mask(x, indices, values, accumulate)
    idx = tuple(slice(None) if i is None else i for i in indices)
    v = jnp.asarray(values, x.dtype)
    return x.at[idx].add(v) if accumulate else x.at[idx].set(v)


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
    which = jnp.clip(jnp.cumsum(mf.astype(jnp.int64)) - 1, 0, k - 1)
    picked = jnp.take(v, which, axis=len(pre))
    keep = mf.reshape((1,) * len(pre) + (n,) + (1,) * len(post))
    new = jnp.where(keep, xr + picked if accumulate else picked, xr)
    return new.reshape(x.shape)


@register("index_add.default", zero_d="all")
def _index_add(sig, x, dim, index, source, alpha=1):
    d = dim % max(x.ndim, 1)
    idx = [slice(None)] * x.ndim
    idx[d] = index
    return x.at[tuple(idx)].add((source * alpha).astype(x.dtype))


@register("index_copy.default", zero_d="all")
def _index_copy(sig, x, dim, index, source):
    d = dim % max(x.ndim, 1)
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
    if src.size == 0:
        return flat.reshape(shape)
    k = jnp.clip(jnp.cumsum(m.astype(jnp.int64)) - 1, 0, src.size - 1)
    return jnp.where(m, src[k], flat).reshape(shape)


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
        base = x if include_self else x.at[idx].set(0)
        return base.at[idx].add(src)
    if reduce == "prod":
        base = x if include_self else x.at[idx].set(1)
        return base.at[idx].multiply(src)
    if reduce == "amax":
        base = x if include_self else x.at[idx].set(_extreme(x.dtype, False))
        return base.at[idx].max(src)
    if reduce == "amin":
        base = x if include_self else x.at[idx].set(_extreme(x.dtype, True))
        return base.at[idx].min(src)
    if reduce == "mean":
        base = x if include_self else x.at[idx].set(0)
        total = base.at[idx].add(src)
        count = (jnp.ones(x.shape, jnp.int64) if include_self else jnp.zeros(x.shape, jnp.int64)
                 ).at[idx].add(1)
        count = jnp.maximum(count, 1)
        if jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.complexfloating):
            return total / count.astype(x.dtype)
        return jnp.floor_divide(total, count.astype(x.dtype))
    raise NotImplementedError(f"aten::scatter_reduce: reduce={reduce!r}")
