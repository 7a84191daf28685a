"""Convolution (forward and transposed, any number of spatial dims) and its backward.

Convolutions run at HIGHEST precision so float32 matches CPU eager; the backward is the vjp
of the forward. Touches only the registry.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .nn_helpers import _HIGHEST, _f, _masked, _ntuple, _vjp
from .registry import register


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups):
    n = w.ndim - 2
    stride, padding, dilation = _ntuple(stride, n), _ntuple(padding, n), _ntuple(dilation, n)
    spec = tuple(range(n + 2))
    dn = lax.ConvDimensionNumbers(lhs_spec=spec, rhs_spec=spec, out_spec=spec)
    if not transposed:
        return lax.conv_general_dilated(
            x, w, window_strides=stride, padding=[(p, p) for p in padding],
            rhs_dilation=dilation, dimension_numbers=dn, feature_group_count=groups,
            precision=_HIGHEST)
    # A transposed convolution is the input-gradient of a forward one: dilate the input by
    # the stride, pad by dilation*(k-1)-padding (+ output_padding at the end) and convolve
    # with the spatially flipped kernel whose in/out features are swapped per group.
    output_padding = _ntuple(output_padding, n) if output_padding else (0,) * n
    cin, cout_g, ks = w.shape[0], w.shape[1], w.shape[2:]
    wt = w.reshape((groups, cin // groups, cout_g) + ks)
    wt = jnp.swapaxes(wt, 1, 2).reshape((groups * cout_g, cin // groups) + ks)
    wt = jnp.flip(wt, axis=tuple(range(2, n + 2)))
    pads = [(d * (k - 1) - p, d * (k - 1) - p + op)
            for k, p, d, op in zip(ks, padding, dilation, output_padding)]
    return lax.conv_general_dilated(
        x, wt, window_strides=(1,) * n, padding=pads, lhs_dilation=stride,
        rhs_dilation=dilation, dimension_numbers=dn, feature_group_count=groups,
        precision=_HIGHEST)


def _channel_shape(c, ndim):
    return (1, c) + (1,) * (ndim - 2)


@register("convolution.default")
def convolution(sig, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    out = _conv(_f(x), _f(w), stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + _f(bias).reshape(_channel_shape(bias.shape[0], out.ndim))
    return out


@register("convolution_backward.default")
def convolution_backward(sig, grad, x, w, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    grad, x, w = _f(grad), _f(x), _f(w)

    def fwd(x_, w_):
        return _conv(x_, w_, stride, padding, dilation, transposed, output_padding, groups)

    gx = gw = None
    if output_mask[0] or output_mask[1]:
        gx, gw = _vjp(fwd, (x, w), grad)
    reduce_axes = tuple(a for a in range(grad.ndim) if a != 1)
    return _masked(sig, output_mask,
                   [lambda: gx, lambda: gw, lambda: jnp.sum(grad, axis=reduce_axes)])
