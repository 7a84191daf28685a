"""More core ATen ops as JAX functions: 3-d pooling, distances, FFTs between real and
complex, embedding bags (and their backward), masked scatter, scatter-reduce.

Each lowering follows PyTorch's eager CPU kernel for the values; output shapes come from
PyTorch's meta kernels (``sig.outs``), which follow the non-CPU convention where PyTorch's
own devices disagree (``_embedding_bag``'s workspace outputs). Ops whose output shape
depends on the data (``nonzero``, ``masked_select``, ``unique``) are not here: they stay
CPU fallbacks on purpose (docs/coverage.md).

Touches only the registry.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .registry import register
from .pooling import _adaptive_matrix

_HI = lax.Precision.HIGHEST


def _f(x):
    """Half-precision floats computed in float32 (PyTorch's CPU opmath type)."""
    if x.dtype in (jnp.bfloat16, jnp.float16):
        return x.astype(jnp.float32)
    return x


def _ntuple(v, n):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return tuple(v * n if len(v) == 1 else v)


# ---------------------------------------------------------------------------------------
# N-d average pooling (avg_pool3d) and adaptive average pooling (_adaptive_avg_pool3d).
def _avg_divisor_nd(in_sz, out_sz, kernel, stride, padding, count_include_pad, divisor_override):
    """Static divisors, shaped like the pooled spatial dims, as PyTorch's CPU kernel."""
    if divisor_override is not None:
        return np.full(out_sz, float(divisor_override))
    div = np.ones((), np.float64)
    for n, o, k, s, p in zip(in_sz, out_sz, kernel, stride, padding):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, n + p)
        size = (end - start) if count_include_pad else (np.minimum(end, n) - np.maximum(start, 0))
        div = np.multiply.outer(div, size.astype(np.float64))
    return div


def _avg_pool_nd(x, out_sz, kernel, stride, padding, count_include_pad, divisor_override):
    n = len(kernel)
    lead = x.ndim - n
    in_sz = x.shape[lead:]
    hi = [max(0, (o - 1) * s + k - i - p) for o, s, k, i, p in zip(out_sz, stride, kernel, in_sz, padding)]
    xp = lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0)] * lead + [(p, h, 0) for p, h in zip(padding, hi)])
    s = lax.reduce_window(xp, jnp.zeros((), x.dtype), lax.add, (1,) * lead + tuple(kernel),
                          (1,) * lead + tuple(stride), "VALID")
    s = s[(Ellipsis,) + tuple(slice(0, o) for o in out_sz)]
    div = _avg_divisor_nd(in_sz, out_sz, kernel, stride, padding, count_include_pad, divisor_override)
    return s / jnp.asarray(div, x.dtype)


@register("avg_pool3d.default")
def avg_pool3d(sig, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    k = _ntuple(kernel_size, 3)
    s = _ntuple(stride, 3) if stride not in (None, [], ()) else k
    p = _ntuple(padding, 3)
    return _avg_pool_nd(_f(x), tuple(sig.outs[0].shape[-3:]), k, s, p, count_include_pad,
                        divisor_override)


def _adaptive_avg_pool_nd(x, out_sz):
    n = len(out_sz)
    div = np.ones((), np.float64)
    for i, o in enumerate(out_sz):
        ax = x.ndim - n + i
        m, c = _adaptive_matrix(x.shape[ax], o)
        x = jnp.moveaxis(jnp.tensordot(x, jnp.asarray(m.T, x.dtype), axes=([ax], [0]), precision=_HI), -1, ax)
        div = np.multiply.outer(div, c)
    return x / jnp.asarray(div, x.dtype)


@register("_adaptive_avg_pool3d.default")
def adaptive_avg_pool3d(sig, x, output_size):
    return _adaptive_avg_pool_nd(_f(x), tuple(sig.outs[0].shape[-3:]))


# ---------------------------------------------------------------------------------------
# Distances.
def _pnorm(d, p, axis=-1):
    a = jnp.abs(d)
    if p == 0:
        return jnp.sum((a != 0).astype(d.dtype), axis=axis)
    if p == 1:
        return jnp.sum(a, axis=axis)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=axis))
    if math.isinf(p):
        return jnp.max(a, axis=axis, initial=0) if p > 0 else jnp.min(a, axis=axis, initial=jnp.inf)
    return jnp.sum(a ** p, axis=axis) ** (1.0 / p)


@register("_cdist_forward.default")
def cdist_forward(sig, x1, x2, p, compute_mode=None):
    x1, x2 = _f(x1), _f(x2)
    return _pnorm(x1[..., :, None, :] - x2[..., None, :, :], float(p))


@register("_cdist_backward.default")
def cdist_backward(sig, grad, x1, x2, p, cdist):
    """Gradient for x1 with PyTorch's CPU formulas per p; a zero distance gives 0, not 0/0."""
    g, x1, x2, dist = _f(grad), _f(x1), _f(x2), _f(cdist)
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    d = dist[..., None]
    safe = jnp.where(d == 0, 1, d)
    p = float(p)
    if p == 0:
        return jnp.zeros_like(x1)
    if p == 1:
        t = jnp.sign(diff)
    elif p == 2:
        t = jnp.where(d == 0, 0, diff / safe)
    elif math.isinf(p):
        t = jnp.sign(diff) * (jnp.abs(diff) == d)
    elif p < 2:
        t = jnp.where((d == 0) | ((diff == 0) & (p < 1)), 0,
                      jnp.sign(diff) * jnp.abs(diff) ** (p - 1) / safe ** (p - 1))
    else:
        t = jnp.where(d == 0, 0, diff * jnp.abs(diff) ** (p - 2) / safe ** (p - 1))
    return jnp.sum(g[..., None] * t, axis=-2)


@register("_pdist_forward.default")
def pdist_forward(sig, x, p=2):
    n = x.shape[0]
    i, j = np.triu_indices(n, 1)
    x = _f(x)
    return _pnorm(x[i] - x[j], float(p))


# ---------------------------------------------------------------------------------------
# FFTs between real and complex (norm: 0 none, 1 by 1/sqrt(n), 2 by 1/n).
def _fft_scale(n, normalization):
    return 1.0 if normalization == 0 else (1.0 / math.sqrt(n) if normalization == 1 else 1.0 / n)


@register("_fft_r2c.default")
def fft_r2c(sig, x, dim, normalization, onesided):
    axes = tuple(d % x.ndim for d in dim)
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    out = jnp.fft.rfftn(x, axes=axes) if onesided else jnp.fft.fftn(x, axes=axes)
    return out * _fft_scale(n, normalization)


@register("_fft_c2r.default")
def fft_c2r(sig, x, dim, normalization, last_dim_size):
    axes = tuple(d % x.ndim for d in dim)
    s = [x.shape[a] for a in axes[:-1]] + [last_dim_size]
    n = int(np.prod(s, dtype=np.int64))
    out = jnp.fft.irfftn(x, s=s, axes=axes)  # scaled by 1/n
    return out * (n * _fft_scale(n, normalization))


# ---------------------------------------------------------------------------------------
# Embedding bags. offset2bag, bag_size and max_indices are workspaces for the backward; they
# take the meta kernels' (non-CPU) shapes: bag of each index, indices per bag, argmax rows.
_SUM, _MEAN, _MAX = 0, 1, 2


@register("_embedding_bag.default")
def embedding_bag(sig, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    n = indices.shape[0]
    nb = offsets.shape[0] - (1 if include_last_offset else 0)
    pos = jnp.arange(n)
    if nb > 0:
        # bag of each index: the last bag whose offset is <= its position
        bag = jnp.searchsorted(offsets[:nb], pos, side="right") - 1
    else:
        bag = jnp.zeros((n,), jnp.int64)
    end = offsets[nb] if include_last_offset else n
    keep = (bag >= 0) & (pos < end)
    if padding_idx is not None and padding_idx >= 0:
        keep = keep & (indices != padding_idx)
    bag_c = jnp.clip(bag, 0, max(nb - 1, 0))
    rows = _f(weight)[indices]
    wdt = rows.dtype
    if mode == _MAX:
        filled = jnp.where(keep[:, None], rows, -jnp.inf)
        out = jax.ops.segment_max(filled, bag_c, num_segments=nb)
        cnt = jax.ops.segment_sum(keep.astype(jnp.int64), bag_c, num_segments=nb)
        out = jnp.where(cnt[:, None] > 0, out, 0).astype(wdt)
        # argmax row: the first index of the bag reaching the maximum
        hit = keep[:, None] & (rows == out[bag_c])
        big = jnp.iinfo(jnp.int64).max
        first = jax.ops.segment_min(jnp.where(hit, pos[:, None], big), bag_c, num_segments=nb)
        max_idx = jnp.where(first == big, -1, indices[jnp.clip(first, 0, max(n - 1, 0))])
    else:
        if per_sample_weights is not None:
            rows = rows * _f(per_sample_weights)[:, None].astype(wdt)
        rows = jnp.where(keep[:, None], rows, 0)
        out = jax.ops.segment_sum(rows, bag_c, num_segments=nb)
        cnt = jax.ops.segment_sum(keep.astype(jnp.int64), bag_c, num_segments=nb)
        if mode == _MEAN:
            out = out / jnp.maximum(cnt, 1)[:, None].astype(wdt)
        max_idx = jnp.zeros(sig.outs[3].shape, jnp.int64)
    sizes = jnp.zeros(sig.outs[2].shape, jnp.int64)
    sizes = sizes.at[:nb].set(cnt) if nb else sizes
    o2b = bag_c if sig.outs[1].shape == (n,) else jnp.zeros(sig.outs[1].shape, jnp.int64)
    return out, o2b, sizes, max_idx


@register("_embedding_bag_backward.default")
def embedding_bag_backward(sig, grad, indices, offsets, offset2bag, bag_size, maximum_indices,
                           num_weights, scale_grad_by_freq, mode, sparse, per_sample_weights,
                           padding_idx=-1):
    """The weight's gradient, from the workspaces ``_embedding_bag`` above returns."""
    grad = _f(grad)
    d = grad.shape[-1]
    gw = jnp.zeros((num_weights, d), grad.dtype)
    if mode == _MAX:
        nb = maximum_indices.shape[0]
        rows = jnp.where(maximum_indices >= 0, maximum_indices, num_weights)  # -1: dropped
        cols = jnp.broadcast_to(jnp.arange(d), (nb, d))
        return gw.at[rows, cols].add(grad[:nb], mode="drop")
    keep = indices != padding_idx if padding_idx is not None and padding_idx >= 0 else \
        jnp.ones(indices.shape, bool)
    g = grad[offset2bag]
    if mode == _MEAN:
        g = g / jnp.maximum(bag_size[offset2bag], 1)[:, None].astype(g.dtype)
    if per_sample_weights is not None:
        g = g * _f(per_sample_weights)[:, None].astype(g.dtype)
    if scale_grad_by_freq:
        freq = jnp.zeros((num_weights,), jnp.int64).at[indices].add(keep.astype(jnp.int64))
        g = g / jnp.maximum(freq[indices], 1)[:, None].astype(g.dtype)
    return gw.at[indices].add(jnp.where(keep[:, None], g, 0))


# ---------------------------------------------------------------------------------------
# Scatters with a static output shape.
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


def _scatter_idx(x, dim, index):
    d = dim % max(x.ndim, 1)
    grids = list(jnp.meshgrid(*[jnp.arange(n) for n in index.shape], indexing="ij"))
    grids[d] = index
    return tuple(grids)


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
