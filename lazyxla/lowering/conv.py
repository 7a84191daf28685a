"""Convolution (forward and transposed, any number of spatial dims) and its backward.

Float32 convolutions compute at the matmul precision (``xla.precision``; float32 itself on the
CPU); the backward is the vjp of the forward. A 2-D convolution over many channels on a small map is lowered as one dot
over its patches (``_PATCHES``): XLA:CPU's own convolution is up to 100x slower there (a 3x3
convolution of 16x512x2x2: 286 ms against 3 ms as a dot; PyTorch's 3 ms). Touches only the
registry.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ..xla import precision
from .nn_helpers import _f, _masked, _ntuple, _vjp
from .registry import register

_PRECISION = precision.of("conv")  # None: the program is traced at the setting


# When a plain 2-D convolution (no groups, no dilation, not transposed) is a dot over its
# patches. Measured with XLA:CPU on this machine, batch 16, forward and backward (ms, XLA's
# convolution / the dot / PyTorch eager): 512->512 3x3 on 2x2 287 / 6.8 / 15; 256->512 3x3
# stride 2 on 4x4 47 / 3.1 / 11; 512->512 3x3 on 7x7 (batch 4) 40 / 16 / 18; 128->128 3x3 on 8x8
# 6.2 / 6.1 / 8.2; 1x1 stride 2 64->128 on 16x16 1.3 / 1.0 / 2.3. XLA's own is faster with few
# channels or a large map: 64->64 3x3 on 8x8 2.2 / 2.4, 32->32 3x3 on 32x32 14 / 36.
_PATCHES = {
    "max_out_positions": 64,   # output height x width
    "min_patch_size": 1024,    # input channels x kernel height x kernel width (a 1x1 kernel: any)
}


def _as_patches_dot(x, w, stride, padding, dilation, groups):
    if x.ndim != 4 or groups != 1 or any(d != 1 for d in dilation):
        return False
    (kh, kw), (hi, wi) = w.shape[2:], x.shape[2:]
    ho = (hi + 2 * padding[0] - kh) // stride[0] + 1
    wo = (wi + 2 * padding[1] - kw) // stride[1] + 1
    return 0 < ho * wo <= _PATCHES["max_out_positions"] and \
        ((kh, kw) == (1, 1) or w.shape[1] * kh * kw >= _PATCHES["min_patch_size"])


def _patches_dot(x, w, stride, padding):
    """The convolution as one dot: every kernel offset's strided window of the padded input,
    stacked (N, C, kh*kw, Ho, Wo), contracted with the kernel over channels and offsets."""
    (kh, kw), (sh, sw), (ph, pw) = w.shape[2:], stride, padding
    xp = jnp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    ho, wo = (xp.shape[2] - kh) // sh + 1, (xp.shape[3] - kw) // sw + 1
    windows = [lax.slice(xp, (0, 0, i, j), (xp.shape[0], xp.shape[1], i + sh * (ho - 1) + 1, j + sw * (wo - 1) + 1),
                         (1, 1, sh, sw)) for i in range(kh) for j in range(kw)]
    patches = jnp.stack(windows, axis=2)
    return jnp.einsum("nckhw,ock->nohw", patches, w.reshape(w.shape[0], w.shape[1], kh * kw), precision=_PRECISION)


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups):
    n = w.ndim - 2
    stride, padding, dilation = _ntuple(stride, n), _ntuple(padding, n), _ntuple(dilation, n)
    if not transposed and _as_patches_dot(x, w, stride, padding, dilation, groups):
        return _patches_dot(x, w, stride, padding)
    spec = tuple(range(n + 2))
    dn = lax.ConvDimensionNumbers(lhs_spec=spec, rhs_spec=spec, out_spec=spec)
    if not transposed:
        return lax.conv_general_dilated(
            x, w, window_strides=stride, padding=[(p, p) for p in padding],
            rhs_dilation=dilation, dimension_numbers=dn, feature_group_count=groups,
            precision=_PRECISION)
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
        precision=_PRECISION)


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
