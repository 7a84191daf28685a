"""Indexing with index tensors as JAX functions: index_select, gather, advanced indexing
(``index.Tensor``), scatter (set, add, legacy reduce), index_put (with integer or boolean
indices), index_add and index_copy.

Every output has a static shape (a boolean index writes through a running count of the mask;
ops whose output shape depends on the data stay CPU fallbacks). Touches only the registry.
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
    return jnp.take_along_axis(x, index, axis=dim % max(x.ndim, 1))


# -- scatter -------------------------------------------------------------------------------
def _scatter_idx(x, dim, index):
    d = dim % x.ndim
    grids = jnp.meshgrid(*[jnp.arange(n) for n in index.shape], indexing="ij")
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


@register("index_add.default")
def _index_add(sig, x, dim, index, source, alpha=1):
    d = dim % max(x.ndim, 1)
    idx = [slice(None)] * x.ndim
    idx[d] = index
    return x.at[tuple(idx)].add((source * alpha).astype(x.dtype))


@register("index_copy.default")
def _index_copy(sig, x, dim, index, source):
    d = dim % max(x.ndim, 1)
    idx = [slice(None)] * x.ndim
    idx[d] = index
    return x.at[tuple(idx)].set(source.astype(x.dtype))
