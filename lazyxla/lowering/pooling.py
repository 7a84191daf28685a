"""Pooling: 2-d max pooling with indices, 2-d average, adaptive average and adaptive max
pooling (with indices), 2-d and 3-d fractional max pooling (windows from the given random
samples), each with its backward; 3-d average, adaptive average and adaptive max pooling and
their backward; the backward of 3-d max pooling (whose forward is PyTorch's decomposition).
PyTorch has no meta kernel for ``fractional_max_pool3d_backward``: its shape rule
(``registry.SHAPE_RULES``) says its output is shaped like the input.

A 2-d window is read as one strided slice of the padded input per kernel offset, stacked on
a last axis K; static numpy arrays say which offsets fall inside the input and which flat
(h * W + w) position of the plane each one reads. Divisors and adaptive windows are static,
computed on the host as PyTorch's CPU kernels compute them. Max pooling keeps the first
maximum of a window, or its last NaN, and the backward ops add each gradient at the flat
position its index names. Touches only the registry.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..xla.widths import long_dtype
from ..xla import precision
from .nn_helpers import _f, _ntuple, _vjp
from .registry import register, shape_rule

_WEIGHTS = precision.of("weights")  # HIGHEST at every setting: the weights must not round


# -- max pooling ---------------------------------------------------------------------------
def _windows(x, out_hw, kernel, stride, padding, dilation, fill):
    """(values [..., OH, OW, K], valid [OH, OW, K], flat_index [OH, OW, K])."""
    H, W = x.shape[-2:]
    OH, OW = out_hw
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    hi_h = max(0, (OH - 1) * sh + (kh - 1) * dh + 1 - H - ph)
    hi_w = max(0, (OW - 1) * sw + (kw - 1) * dw + 1 - W - pw)
    cfg = [(0, 0, 0)] * (x.ndim - 2) + [(ph, hi_h, 0), (pw, hi_w, 0)]
    xp = lax.pad(x, jnp.asarray(fill, x.dtype), cfg)
    lead = x.shape[:-2]
    views, valid, index = [], [], []
    rows0, cols0 = np.arange(OH) * sh - ph, np.arange(OW) * sw - pw
    for i in range(kh):
        for j in range(kw):
            start = (0,) * len(lead) + (i * dh, j * dw)
            limit = lead + (i * dh + (OH - 1) * sh + 1, j * dw + (OW - 1) * sw + 1)
            views.append(lax.slice(xp, start, limit, (1,) * len(lead) + (sh, sw)))
            r, c = rows0 + i * dh, cols0 + j * dw
            valid.append(((r >= 0) & (r < H))[:, None] & ((c >= 0) & (c < W))[None, :])
            index.append(r[:, None] * W + c[None, :])
    return jnp.stack(views, axis=-1), np.stack(valid, axis=-1), np.stack(index, axis=-1)


def _pair(v):
    """An ``int[2]`` argument as a pair (PyTorch accepts a single int / 1-element list)."""
    if isinstance(v, (list, tuple)):
        return (v[0], v[0]) if len(v) == 1 else tuple(v)
    return (v, v)


def _pool_params(kernel, stride, padding, dilation=1):
    kernel = _pair(kernel)
    stride = _pair(stride) if stride not in (None, [], ()) else kernel
    return kernel, stride, _pair(padding), _pair(dilation)


def _lowest(dtype):
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


def _max_pool(x, out_hw, kernel, stride, padding, dilation):
    v, valid, index = _windows(x, out_hw, kernel, stride, padding, dilation, _lowest(x.dtype))
    return _window_max(x, v, valid, index)


def _window_max(x, v, valid, index):
    """Max over the last axis K of the windows ``v`` [..., OH, OW, K] and its flat index in
    the plane (``index`` [OH, OW, K]); positions not ``valid`` never win."""
    out = jnp.max(v, axis=-1)
    # PyTorch scans the window in order keeping the first maximum, but a NaN always wins
    # (so the last NaN is kept); padding never wins.
    pick = jnp.argmax(valid & (v == out[..., None]), axis=-1)
    if jnp.issubdtype(x.dtype, jnp.floating):
        nan = jnp.isnan(v)
        last_nan = v.shape[-1] - 1 - jnp.argmax(nan[..., ::-1], axis=-1)
        pick = jnp.where(jnp.any(nan, axis=-1), last_nan, pick)
    idx = jnp.take_along_axis(jnp.broadcast_to(jnp.asarray(index, long_dtype()), v.shape),
                              pick[..., None], axis=-1)[..., 0]
    return out, idx


@register("max_pool2d_with_indices.default")
def max_pool2d_with_indices(sig, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    k, s, p, d = _pool_params(kernel_size, stride, padding, dilation)
    return _max_pool(x, sig.outs[0].shape[-2:], k, s, p, d)


@register("max_pool2d_with_indices_backward.default")
def max_pool2d_with_indices_backward(sig, grad, x, kernel_size, stride, padding, dilation, ceil_mode,
                                     indices):
    return _scatter_to_planes(grad, x, indices)


def _scatter_to_planes(grad, x, indices, nd=2):
    """Each output's gradient added at the flat position (in its plane of the ``nd``
    spatial dims) its index names."""
    sp = x.shape[-nd:]
    n = int(np.prod(sp, dtype=np.int64))
    lead = x.shape[:-nd]
    g = _f(grad).reshape((-1, int(np.prod(grad.shape[-nd:], dtype=np.int64))))
    i = indices.reshape(g.shape)
    planes = jax.vmap(lambda gp, ip: jnp.zeros((n,), gp.dtype).at[ip].add(gp))(g, i)
    return planes.reshape(lead + sp)


# -- average pooling -----------------------------------------------------------------------
def _avg_divisor(in_sz, out_sz, kernel, stride, padding, count_include_pad, divisor_override):
    """Static divisors, shaped like the pooled spatial dims, as PyTorch's CPU kernel computes them."""
    if divisor_override is not None:
        return np.full(out_sz, float(divisor_override))
    div = np.ones((), np.float64)
    for n, o, k, s, p in zip(in_sz, out_sz, kernel, stride, padding):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, n + p)
        size = (end - start) if count_include_pad else (np.minimum(end, n) - np.maximum(start, 0))
        div = np.multiply.outer(div, size.astype(np.float64))
    return div


def _avg_pool(x, out_hw, kernel, stride, padding, count_include_pad, divisor_override):
    v, _, _ = _windows(x, out_hw, kernel, stride, padding, (1, 1), 0)
    div = _avg_divisor(x.shape[-2:], out_hw, kernel, stride, padding, count_include_pad,
                       divisor_override)
    return jnp.sum(v, axis=-1) / jnp.asarray(div, x.dtype)


@register("avg_pool2d.default")
def avg_pool2d(sig, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    k, s, p, _ = _pool_params(kernel_size, stride, padding)
    return _avg_pool(_f(x), sig.outs[0].shape[-2:], k, s, p, count_include_pad, divisor_override)


@register("avg_pool2d_backward.default")
def avg_pool2d_backward(sig, grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    k, s, p, _ = _pool_params(kernel_size, stride, padding)
    out_hw = grad.shape[-2:]
    fwd = lambda x_: _avg_pool(x_, out_hw, k, s, p, count_include_pad, divisor_override)
    return _vjp(fwd, (_f(x),), _f(grad))[0]


# 3-d: the window sums as one reduce_window over the padded input.
def _avg_pool_nd(x, out_sz, kernel, stride, padding, count_include_pad, divisor_override):
    n = len(kernel)
    lead = x.ndim - n
    in_sz = x.shape[lead:]
    hi = [max(0, (o - 1) * s + k - i - p) for o, s, k, i, p in zip(out_sz, stride, kernel, in_sz, padding)]
    xp = lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0)] * lead + [(p, h, 0) for p, h in zip(padding, hi)])
    # a concrete zero: JAX then takes the differentiable window sum (the backward is its vjp)
    s = lax.reduce_window(xp, np.zeros((), np.dtype(x.dtype)), lax.add, (1,) * lead + tuple(kernel),
                          (1,) * lead + tuple(stride), "VALID")
    s = s[(Ellipsis,) + tuple(slice(0, o) for o in out_sz)]
    div = _avg_divisor(in_sz, out_sz, kernel, stride, padding, count_include_pad, divisor_override)
    return s / jnp.asarray(div, x.dtype)


@register("avg_pool3d.default")
def avg_pool3d(sig, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    k = _ntuple(kernel_size, 3)
    s = _ntuple(stride, 3) if stride not in (None, [], ()) else k
    p = _ntuple(padding, 3)
    return _avg_pool_nd(_f(x), tuple(sig.outs[0].shape[-3:]), k, s, p, count_include_pad,
                        divisor_override)


# -- adaptive average pooling --------------------------------------------------------------
def _adaptive_matrix(n_in, n_out):
    """0/1 [n_out, n_in] membership of PyTorch's adaptive windows, and their sizes."""
    o = np.arange(n_out)
    start = (o * n_in) // n_out
    end = -((-(o + 1) * n_in) // n_out)
    cols = np.arange(n_in)
    m = ((cols[None, :] >= start[:, None]) & (cols[None, :] < end[:, None])).astype(np.float64)
    return m, (end - start).astype(np.float64)


def _adaptive_avg_pool(x, out_hw):
    mh, ch = _adaptive_matrix(x.shape[-2], out_hw[0])
    mw, cw = _adaptive_matrix(x.shape[-1], out_hw[1])
    s = jnp.einsum("ph,...hw,qw->...pq", jnp.asarray(mh, x.dtype), x, jnp.asarray(mw, x.dtype),
                   precision=_WEIGHTS)
    return s / jnp.asarray(np.outer(ch, cw), x.dtype)


@register("_adaptive_avg_pool2d.default")
def adaptive_avg_pool2d(sig, x, output_size):
    return _adaptive_avg_pool(_f(x), tuple(sig.outs[0].shape[-2:]))


@register("_adaptive_avg_pool2d_backward.default")
def adaptive_avg_pool2d_backward(sig, grad, x):
    out_hw = tuple(grad.shape[-2:])
    return _vjp(lambda x_: _adaptive_avg_pool(x_, out_hw), (_f(x),), _f(grad))[0]


# 3-d: the windows as one membership matrix per pooled axis.
def _adaptive_avg_pool_nd(x, out_sz):
    n = len(out_sz)
    div = np.ones((), np.float64)
    for i, o in enumerate(out_sz):
        ax = x.ndim - n + i
        m, c = _adaptive_matrix(x.shape[ax], o)
        x = jnp.moveaxis(jnp.tensordot(x, jnp.asarray(m.T, x.dtype), axes=([ax], [0]), precision=_WEIGHTS), -1, ax)
        div = np.multiply.outer(div, c)
    return x / jnp.asarray(div, x.dtype)


@register("_adaptive_avg_pool3d.default")
def adaptive_avg_pool3d(sig, x, output_size):
    return _adaptive_avg_pool_nd(_f(x), tuple(sig.outs[0].shape[-3:]))


# -- adaptive max pooling ------------------------------------------------------------------
def _adaptive_windows(n_in, n_out):
    """PyTorch's adaptive windows [floor(i*in/out), ceil((i+1)*in/out)) as (start, size):
    positions [n_out, K] (clipped) and which of them are in the window."""
    o = np.arange(n_out)
    start = (o * n_in) // n_out
    end = -((-(o + 1) * n_in) // n_out)
    k = int((end - start).max()) if n_out else 1
    pos = start[:, None] + np.arange(k)[None, :]
    return np.minimum(pos, n_in - 1), pos < end[:, None]


def _adaptive_max_pool(x, out_sz):
    """Adaptive max pooling over the last len(out_sz) dims: each output's window is read by
    a static gather of flat plane positions (windows padded to the largest, never winning)."""
    nd = len(out_sz)
    sp = x.shape[-nd:]
    lead = x.shape[:-nd]
    flat, valid = np.zeros((), np.int64), np.ones((), bool)
    for d in range(nd):   # outer product over dims: [O1, K1] x [O2, K2] ... -> [O1, ..., K1, ...]
        pos, ok = _adaptive_windows(sp[d], out_sz[d])
        flat = _outer(flat * sp[d], pos, d, nd, np.add)
        valid = _outer(valid, ok, d, nd, np.logical_and)
    k = int(np.prod(flat.shape[nd:], dtype=np.int64))
    flat = flat.reshape(tuple(out_sz) + (k,))
    valid = valid.reshape(tuple(out_sz) + (k,))
    planes = x.reshape(lead + (-1,))
    v = jnp.take(planes, jnp.asarray(flat.reshape(-1)), axis=-1).reshape(lead + flat.shape)
    v = jnp.where(valid, v, jnp.asarray(_lowest(x.dtype), x.dtype))
    return _window_max(x, v, valid, flat)


def _outer(acc, a, d, nd, op):
    """Combine ``acc`` [O1..Od, K1..Kd] (0-d at first) with dim d's [Od+1, Kd+1] array."""
    o, kk = a.shape
    if acc.ndim == 0:
        return op(acc, a)
    out_part, k_part = acc.shape[:d], acc.shape[d:]
    acc = acc.reshape(out_part + (1,) + k_part + (1,))
    return op(acc, a.reshape((1,) * d + (o,) + (1,) * d + (kk,)))


@register("adaptive_max_pool2d.default")
def adaptive_max_pool2d(sig, x, output_size):
    return _adaptive_max_pool(x, tuple(sig.outs[0].shape[-2:]))


@register("adaptive_max_pool3d.default")
def adaptive_max_pool3d(sig, x, output_size):
    return _adaptive_max_pool(x, tuple(sig.outs[0].shape[-3:]))


@register("adaptive_max_pool2d_backward.default")
def adaptive_max_pool2d_backward(sig, grad, x, indices):
    return _scatter_to_planes(grad, x, indices)



# -- 3-d backward ops ----------------------------------------------------------------------
@register("avg_pool3d_backward.default")
def avg_pool3d_backward(sig, grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    k = _ntuple(kernel_size, 3)
    s = _ntuple(stride, 3) if stride not in (None, [], ()) else k
    p = _ntuple(padding, 3)
    out_sz = tuple(grad.shape[-3:])
    fwd = lambda x_: _avg_pool_nd(x_, out_sz, k, s, p, count_include_pad, divisor_override)
    return _vjp(fwd, (_f(x),), _f(grad))[0]


@register("_adaptive_avg_pool3d_backward.default")
def adaptive_avg_pool3d_backward(sig, grad, x):
    out_sz = tuple(grad.shape[-3:])
    return _vjp(lambda x_: _adaptive_avg_pool_nd(x_, out_sz), (_f(x),), _f(grad))[0]


@register("max_pool3d_with_indices_backward.default")
def max_pool3d_with_indices_backward(sig, grad, x, kernel_size, stride, padding, dilation, ceil_mode,
                                     indices):
    return _scatter_to_planes(grad, x, indices, 3)


@register("adaptive_max_pool3d_backward.default")
def adaptive_max_pool3d_backward(sig, grad, x, indices):
    return _scatter_to_planes(grad, x, indices, 3)


# -- fractional max pooling ----------------------------------------------------------------
def _intervals(sample, n_in, n_out, pool):
    """PyTorch's ``generate_intervals``: window starts from a sample in [0, 1), computed in
    the input's dtype: floor((i + u) * alpha) - floor(u * alpha), the last at n_in - pool."""
    i = jnp.arange(n_out, dtype=sample.dtype)
    if n_out > 1:
        alpha = jnp.asarray(n_in - pool, sample.dtype) / jnp.asarray(n_out - 1, sample.dtype)
        start = ((i + sample[..., None]) * alpha).astype(long_dtype()) - (sample[..., None] * alpha).astype(long_dtype())
    else:
        start = jnp.zeros(sample.shape + (n_out,), long_dtype())
    return start.at[..., n_out - 1].set(n_in - pool) if n_out else start


def _fractional_max_pool(x, kernel, out_sz, samples):
    """x [N?, C, *S], samples [N?, C, nd] (the last spatial dim's sample first for 2-d, the
    first's for 3-d, as PyTorch reads them) -> (values, flat indices) [N?, C, *out_sz]."""
    nd = len(out_sz)
    sp = x.shape[-nd:]
    order = (1, 0) if nd == 2 else (0, 1, 2)     # which sample each spatial dim uses
    starts = [_intervals(samples[..., order[d]], sp[d], out_sz[d], kernel[d]) for d in range(nd)]
    lead = x.shape[:-nd]
    # flat plane index of every (output position, window offset)
    flat = jnp.zeros(lead + tuple(out_sz) + tuple(kernel), long_dtype())
    for d in range(nd):
        shp = [1] * nd
        shp[d] = out_sz[d]
        kshp = [1] * nd
        kshp[d] = kernel[d]
        pos = starts[d].reshape(lead + tuple(shp) + (1,) * nd) + jnp.arange(kernel[d]).reshape(tuple(kshp))
        flat = flat * sp[d] + pos
    k = int(np.prod(kernel, dtype=np.int64))
    flat = flat.reshape(lead + tuple(out_sz) + (k,))
    planes = x.reshape(lead + (-1,))
    v = jnp.take_along_axis(planes, flat.reshape(lead + (-1,)), axis=-1).reshape(flat.shape)
    out = jnp.max(v, axis=-1)
    pick = jnp.argmax(v == out[..., None], axis=-1)
    if jnp.issubdtype(x.dtype, jnp.floating):
        nan = jnp.isnan(v)
        pick = jnp.where(jnp.any(nan, axis=-1), k - 1 - jnp.argmax(nan[..., ::-1], axis=-1), pick)
    idx = jnp.take_along_axis(flat, pick[..., None], axis=-1)[..., 0]
    return out, idx


@register("fractional_max_pool2d.default")
def fractional_max_pool2d(sig, x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, _ntuple(kernel_size, 2), tuple(sig.outs[0].shape[-2:]),
                                random_samples.astype(x.dtype))


@register("fractional_max_pool3d.default")
def fractional_max_pool3d(sig, x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, _ntuple(kernel_size, 3), tuple(sig.outs[0].shape[-3:]),
                                random_samples.astype(x.dtype))


@register("fractional_max_pool2d_backward.default")
def fractional_max_pool2d_backward(sig, grad, x, kernel_size, output_size, indices):
    return _scatter_to_planes(grad, x, indices, 2)


@shape_rule("fractional_max_pool3d_backward.default")
def _grad_like_input(grad, x, *args, **kwargs):  # no meta kernel in PyTorch: the input's gradient
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@register("fractional_max_pool3d_backward.default")
def fractional_max_pool3d_backward(sig, grad, x, kernel_size, output_size, indices):
    return _scatter_to_planes(grad, x, indices, 3)
