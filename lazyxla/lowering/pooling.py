"""Pooling: 2-d max pooling with indices, 2-d average and adaptive average pooling, each
with its backward; 3-d average and adaptive average pooling (forward ops).

A 2-d window is read as one strided slice of the padded input per kernel offset, stacked on
a last axis K; static numpy arrays say which offsets fall inside the input and which flat
(h * W + w) position of the plane each one reads. Divisors and adaptive windows are static,
computed on the host as PyTorch's CPU kernels compute them. Touches only the registry.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .nn_helpers import _HIGHEST, _f, _ntuple, _vjp
from .registry import register


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
    out = jnp.max(v, axis=-1)
    # PyTorch scans the window in order keeping the first maximum, but a NaN always wins
    # (so the last NaN is kept); padding never wins.
    pick = jnp.argmax(valid & (v == out[..., None]), axis=-1)
    if jnp.issubdtype(x.dtype, jnp.floating):
        nan = jnp.isnan(v)
        last_nan = v.shape[-1] - 1 - jnp.argmax(nan[..., ::-1], axis=-1)
        pick = jnp.where(jnp.any(nan, axis=-1), last_nan, pick)
    idx = jnp.take_along_axis(jnp.broadcast_to(jnp.asarray(index, jnp.int64), v.shape),
                              pick[..., None], axis=-1)[..., 0]
    return out, idx


@register("max_pool2d_with_indices.default")
def max_pool2d_with_indices(sig, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    k, s, p, d = _pool_params(kernel_size, stride, padding, dilation)
    return _max_pool(x, sig.outs[0].shape[-2:], k, s, p, d)


@register("max_pool2d_with_indices_backward.default")
def max_pool2d_with_indices_backward(sig, grad, x, kernel_size, stride, padding, dilation, ceil_mode,
                                     indices):
    H, W = x.shape[-2:]
    lead = grad.shape[:-2]
    g = _f(grad).reshape((-1, grad.shape[-2] * grad.shape[-1]))
    i = indices.reshape(g.shape)
    planes = jax.vmap(lambda gp, ip: jnp.zeros((H * W,), gp.dtype).at[ip].add(gp))(g, i)
    return planes.reshape(lead + (H, W))


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
    s = lax.reduce_window(xp, jnp.zeros((), x.dtype), lax.add, (1,) * lead + tuple(kernel),
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
                   precision=_HIGHEST)
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
        x = jnp.moveaxis(jnp.tensordot(x, jnp.asarray(m.T, x.dtype), axes=([ax], [0]), precision=_HIGHEST), -1, ax)
        div = np.multiply.outer(div, c)
    return x / jnp.asarray(div, x.dtype)


@register("_adaptive_avg_pool3d.default")
def adaptive_avg_pool3d(sig, x, output_size):
    return _adaptive_avg_pool_nd(_f(x), tuple(sig.outs[0].shape[-3:]))
