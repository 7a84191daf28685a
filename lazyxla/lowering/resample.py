"""Resampling (``F.interpolate``): nearest and bilinear 2-d upsampling and their backward.

Source indices and weights are computed on the host the way PyTorch's CPU kernels do (in
float32 for float32 and half inputs), so forward and backward (the vjp of the forward, a
scatter-add) pick the same pixels. Touches only the registry.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .nn_helpers import _f, _vjp
from .registry import register


def _scale(n_in, n_out, align_corners, scale, ftype):
    if align_corners:
        return ftype((n_in - 1) / (n_out - 1)) if n_out > 1 else ftype(0)
    if scale is not None and scale > 0:
        return ftype(1.0 / scale)
    return ftype(n_in) / ftype(n_out)


def _nearest_index(n_in, n_out, scale):
    o = np.arange(n_out)
    if n_out == n_in:
        return o
    if n_out == 2 * n_in:
        return o >> 1
    s = _scale(n_in, n_out, False, scale, np.float32)
    return np.minimum(np.floor(o.astype(np.float32) * s).astype(np.int64), n_in - 1)


def _linear_weights(n_in, n_out, align_corners, scale, ftype):
    """(index0, index1, lambda0, lambda1) per output position."""
    s = _scale(n_in, n_out, align_corners, scale, ftype)
    o = np.arange(n_out).astype(ftype)
    src = s * o if align_corners else np.maximum(s * (o + ftype(0.5)) - ftype(0.5), ftype(0))
    i0 = src.astype(np.int64)
    l1 = np.clip(src - i0.astype(ftype), 0, 1).astype(ftype)
    i1 = i0 + (i0 < n_in - 1)
    return i0, i1, (ftype(1) - l1).astype(ftype), l1


def _nearest2d(x, out_hw, scales):
    ih = _nearest_index(x.shape[-2], out_hw[0], scales[0])
    iw = _nearest_index(x.shape[-1], out_hw[1], scales[1])
    return jnp.take(jnp.take(x, jnp.asarray(ih), axis=-2), jnp.asarray(iw), axis=-1)


def _bilinear2d(x, out_hw, align_corners, scales):
    ftype = np.float64 if x.dtype == jnp.float64 else np.float32
    h0, h1, a0, a1 = _linear_weights(x.shape[-2], out_hw[0], align_corners, scales[0], ftype)
    w0, w1, b0, b1 = _linear_weights(x.shape[-1], out_hw[1], align_corners, scales[1], ftype)
    c = lambda v: jnp.asarray(v, x.dtype)
    rows = (jnp.take(x, jnp.asarray(h0), axis=-2) * c(a0)[:, None]
            + jnp.take(x, jnp.asarray(h1), axis=-2) * c(a1)[:, None])
    return jnp.take(rows, jnp.asarray(w0), axis=-1) * c(b0) + jnp.take(rows, jnp.asarray(w1), axis=-1) * c(b1)


@register("upsample_nearest2d.default")
def upsample_nearest2d(sig, x, output_size, scales_h=None, scales_w=None):
    return _nearest2d(x, tuple(sig.outs[0].shape[-2:]), (scales_h, scales_w))


@register("upsample_nearest2d_backward.default")
def upsample_nearest2d_backward(sig, grad, output_size, input_size, scales_h=None, scales_w=None):
    out_hw = tuple(grad.shape[-2:])
    x0 = jnp.zeros(tuple(input_size), _f(grad).dtype)
    return _vjp(lambda x_: _nearest2d(x_, out_hw, (scales_h, scales_w)), (x0,), _f(grad))[0]


@register("upsample_bilinear2d.default")
def upsample_bilinear2d(sig, x, output_size, align_corners, scales_h=None, scales_w=None):
    return _bilinear2d(_f(x), tuple(sig.outs[0].shape[-2:]), align_corners, (scales_h, scales_w))


@register("upsample_bilinear2d_backward.default")
def upsample_bilinear2d_backward(sig, grad, output_size, input_size, align_corners, scales_h=None,
                                 scales_w=None):
    out_hw = tuple(grad.shape[-2:])
    x0 = jnp.zeros(tuple(input_size), _f(grad).dtype)
    fwd = lambda x_: _bilinear2d(x_, out_hw, align_corners, (scales_h, scales_w))
    return _vjp(fwd, (x0,), _f(grad))[0]
