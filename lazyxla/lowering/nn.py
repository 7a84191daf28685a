"""Lowerings of the neural-network ATen ops: convolution, pooling, softmax, losses,
layer norm, embedding and activations, each with its backward op.

Every lowering follows the convention of ``lazyxla.lowering``: ``fn(sig, *args, **kwargs)``
receives the ATen call as PyTorch's dispatcher made it (tensors as JAX arrays) and returns
JAX arrays shaped like ``sig.outs``. Numerics follow PyTorch's eager CPU kernels: half
precision inputs (bf16/f16) are computed in float32 (the caller casts the results back),
and piecewise backward formulas copy PyTorch's boundary conventions. Backward ops of
smooth or linear forwards are the ``jax.vjp`` of the forward lowering written here.

May touch: nothing but the lowering registry.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .registry import register

_HIGHEST = lax.Precision.HIGHEST
_REDUCTION_NONE, _REDUCTION_MEAN, _REDUCTION_SUM = 0, 1, 2


# ---------------------------------------------------------------------------------------
# Helpers.
def _f(x):
    """Upcast half-precision floats to float32 (PyTorch's CPU opmath type)."""
    if x is not None and x.dtype in (jnp.bfloat16, jnp.float16):
        return x.astype(jnp.float32)
    return x


def _s(v, like):
    """A scalar argument (Python number or 0-d array) in the dtype of ``like``."""
    return jnp.asarray(v, dtype=like.dtype)


def _pair(v):
    """An ``int[2]`` argument as a pair (PyTorch accepts a single int / 1-element list)."""
    if isinstance(v, (list, tuple)):
        return (v[0], v[0]) if len(v) == 1 else tuple(v)
    return (v, v)


def _ntuple(v, n):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return tuple(v * n if len(v) == 1 else v)


def _vjp(fn, primals, cotangent):
    """Gradients of ``fn`` at ``primals`` for the output cotangent (one per primal)."""
    out, pull = jax.vjp(fn, *primals)
    return pull(jnp.broadcast_to(cotangent, out.shape).astype(out.dtype))


def _reduce(loss, reduction):
    if reduction == _REDUCTION_MEAN:
        return jnp.mean(loss)
    if reduction == _REDUCTION_SUM:
        return jnp.sum(loss)
    return loss


def _loss_norm(grad, x, reduction):
    """Scale of a pointwise loss's backward: 1/numel for mean, 1 otherwise."""
    if reduction == _REDUCTION_MEAN:
        return grad / x.size
    return grad


def _masked(sig, present, makers):
    """Outputs of a backward op with ``output_mask``: ``makers[i]()`` for each present
    output; an absent output (PyTorch's meta returns None) is zeros shaped like its meta
    when ``sig.outs`` keeps a slot for it, else it is left out of the tuple."""
    if len(sig.outs) == len(makers):
        res = []
        for p, make, meta in zip(present, makers, sig.outs):
            if p:
                res.append(make())
            else:
                res.append(jnp.zeros(tuple(meta.shape) if meta is not None else (), jnp.float32))
        return tuple(res)
    return tuple(make() for p, make in zip(present, makers) if p)


# ---------------------------------------------------------------------------------------
# Convolution.
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


# ---------------------------------------------------------------------------------------
# 2-d pooling. A window is read as one strided slice of the padded input per kernel
# offset, stacked on a last axis K; static numpy arrays say which offsets fall inside the
# input and which flat (h * W + w) position of the plane each one reads.
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


def _avg_divisor(in_hw, out_hw, kernel, stride, padding, count_include_pad, divisor_override):
    """Static [OH, OW] divisors as PyTorch's CPU kernel computes them."""
    if divisor_override is not None:
        return np.full(out_hw, float(divisor_override))
    sizes = []
    for n, o, k, s, p in zip(in_hw, out_hw, kernel, stride, padding):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, n + p)
        full = end - start
        inside = np.minimum(end, n) - np.maximum(start, 0)
        sizes.append(full if count_include_pad else inside)
    return np.outer(sizes[0], sizes[1]).astype(np.float64)


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


# ---------------------------------------------------------------------------------------
# Resampling (F.interpolate): source indices and weights computed on the host the way
# PyTorch's CPU kernels do (in float32 for float32 and half inputs), so forward and backward
# (the vjp of the forward, a scatter-add) pick the same pixels.
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


# ---------------------------------------------------------------------------------------
# Softmax.
def _along(fn, dim, *xs):
    """``fn(*xs, axis)`` along ``dim``; 0-d inputs are treated as 1-element vectors."""
    if xs[0].ndim == 0:
        return fn(*(x.reshape(1) for x in xs), 0).reshape(())
    return fn(*xs, dim % xs[0].ndim)


def _softmax_fn(x, axis):
    e = jnp.exp(x - jnp.max(x, axis=axis, keepdims=True))
    return e / jnp.sum(e, axis=axis, keepdims=True)


def _log_softmax_fn(x, axis):
    sh = x - jnp.max(x, axis=axis, keepdims=True)
    return sh - jnp.log(jnp.sum(jnp.exp(sh), axis=axis, keepdims=True))


def _softmax_grad_fn(grad, out, axis):
    return out * (grad - jnp.sum(grad * out, axis=axis, keepdims=True))


def _log_softmax_grad_fn(grad, out, axis):
    return grad - jnp.exp(out) * jnp.sum(grad, axis=axis, keepdims=True)


@register("_softmax.default")
def softmax(sig, x, dim, half_to_float):
    return _along(_softmax_fn, dim, _f(x))


@register("_log_softmax.default")
def log_softmax(sig, x, dim, half_to_float):
    return _along(_log_softmax_fn, dim, _f(x))


@register("_softmax_backward_data.default")
def softmax_backward_data(sig, grad, out, dim, input_dtype):
    return _along(_softmax_grad_fn, dim, _f(grad), _f(out))


@register("_log_softmax_backward_data.default")
def log_softmax_backward_data(sig, grad, out, dim, input_dtype):
    return _along(_log_softmax_grad_fn, dim, _f(grad), _f(out))


# ---------------------------------------------------------------------------------------
# Losses.
def _nll_parts(x, target, weight, ignore_index):
    """(class axis, valid mask, safe target, per-element weight with ignored set to 0)."""
    cdim = 1 if x.ndim > 1 else 0
    valid = target != ignore_index
    t = jnp.where(valid, target, 0)
    w = jnp.take(weight, t, axis=0) if weight is not None else jnp.ones(t.shape, x.dtype)
    return cdim, valid, t, jnp.where(valid, w.astype(x.dtype), 0)


def _nll_forward(sig, x, target, weight, reduction, ignore_index):
    x = _f(x)
    cdim, valid, t, w = _nll_parts(x, target, _f(weight), ignore_index)
    picked = jnp.take_along_axis(x, jnp.expand_dims(t, cdim), axis=cdim).squeeze(cdim)
    losses = jnp.where(valid, -picked * w, 0)
    if reduction == _REDUCTION_NONE and x.ndim > 1:
        return losses, jnp.zeros((), x.dtype)  # PyTorch leaves total_weight at 0 here
    total = jnp.sum(w)
    loss = jnp.sum(losses)
    return (loss / total if reduction == _REDUCTION_MEAN else loss), total


def _nll_backward(sig, grad, x, target, weight, reduction, ignore_index, total_weight):
    x, grad = _f(x), _f(grad)
    cdim, valid, t, w = _nll_parts(x, target, _f(weight), ignore_index)
    if reduction == _REDUCTION_MEAN:
        grad = grad / total_weight.astype(x.dtype)
    coef = jnp.where(valid, -w * grad, 0)
    onehot = jax.nn.one_hot(t, x.shape[cdim], dtype=x.dtype, axis=cdim)
    return onehot * jnp.expand_dims(coef, cdim)


register("nll_loss_forward.default", "nll_loss2d_forward.default")(_nll_forward)
register("nll_loss_backward.default", "nll_loss2d_backward.default")(_nll_backward)


def _mse(x, t, reduction):
    return _reduce((x - t) ** 2, reduction)


@register("mse_loss.default")
def mse_loss(sig, x, t, reduction=_REDUCTION_MEAN):
    return _mse(_f(x), _f(t), reduction)


@register("mse_loss_backward.default")
def mse_loss_backward(sig, grad, x, t, reduction):
    t = _f(t)
    return _vjp(lambda x_: _mse(x_, t, reduction), (_f(x),), _f(grad))[0]


_BCE_EPS = 1e-12  # PyTorch's floor for x * (1 - x) in the BCE backward


@register("binary_cross_entropy.default")
def binary_cross_entropy(sig, x, t, weight=None, reduction=_REDUCTION_MEAN):
    x, t = _f(x), _f(t)
    floor = _s(-100, x)  # PyTorch clamps the logs at -100
    loss = (t - 1) * jnp.maximum(jnp.log1p(-x), floor) - t * jnp.maximum(jnp.log(x), floor)
    if weight is not None:
        loss = loss * _f(weight)
    return _reduce(loss, reduction)


@register("binary_cross_entropy_backward.default")
def binary_cross_entropy_backward(sig, grad, x, t, weight=None, reduction=_REDUCTION_MEAN):
    x, t, grad = _f(x), _f(t), _f(grad)
    g = _loss_norm(grad, x, reduction) * (x - t) / jnp.maximum((1 - x) * x, _s(_BCE_EPS, x))
    if weight is not None:
        g = g * _f(weight)
    return g


@register("smooth_l1_loss.default")
def smooth_l1_loss(sig, x, t, reduction=_REDUCTION_MEAN, beta=1.0):
    z = jnp.abs(_f(x) - _f(t))
    loss = z - 0.5 * beta if beta == 0 else jnp.where(z < beta, 0.5 * z * z / beta, z - 0.5 * beta)
    return _reduce(loss, reduction)


@register("smooth_l1_loss_backward.default")
def smooth_l1_loss_backward(sig, grad, x, t, reduction, beta):
    x, t, grad = _f(x), _f(t), _f(grad)
    d = x - t
    g = _loss_norm(grad, x, reduction)
    inner = d * g / beta if beta != 0 else jnp.zeros_like(d)
    return jnp.where(d <= -beta, -g, jnp.where(d >= beta, g, inner))


@register("huber_loss.default")
def huber_loss(sig, x, t, reduction=_REDUCTION_MEAN, delta=1.0):
    z = jnp.abs(_f(x) - _f(t))
    return _reduce(jnp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta)), reduction)


@register("huber_loss_backward.default")
def huber_loss_backward(sig, grad, x, t, reduction, delta):
    x, t, grad = _f(x), _f(t), _f(grad)
    d = x - t
    g = _loss_norm(grad, x, reduction)
    return jnp.where(d <= -delta, -g * delta, jnp.where(d >= delta, g * delta, d * g))


# ---------------------------------------------------------------------------------------
# Layer norm.
def _inner_axes(x, normalized_shape):
    return tuple(range(x.ndim - len(normalized_shape), x.ndim))


@register("native_layer_norm.default")
def native_layer_norm(sig, x, normalized_shape, weight, bias, eps):
    x = _f(x)
    axes = _inner_axes(x, normalized_shape)
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + _s(eps, x))
    out = (x - mean) * rstd
    if weight is not None:
        out = out * _f(weight)
    if bias is not None:
        out = out + _f(bias)
    return out, mean, rstd


@register("native_layer_norm_backward.default")
def native_layer_norm_backward(sig, grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    grad, x = _f(grad), _f(x)
    axes = _inner_axes(x, normalized_shape)
    outer = tuple(range(x.ndim - len(normalized_shape)))
    mean = _f(mean).reshape(x.shape[:len(outer)] + (1,) * len(axes))
    rstd = _f(rstd).reshape(mean.shape)
    n = math.prod(x.shape[len(outer):])
    x_hat = (x - mean) * rstd

    def d_input():
        gx = grad * _f(weight) if weight is not None else grad
        inner = (gx * n - jnp.sum(gx, axes, keepdims=True)
                 - x_hat * jnp.sum(gx * x_hat, axes, keepdims=True))
        return rstd / n * inner

    present = (output_mask[0], output_mask[1] and weight is not None,
               output_mask[2] and bias is not None)
    return _masked(sig, present, [d_input, lambda: jnp.sum(grad * x_hat, outer),
                                  lambda: jnp.sum(grad, outer)])


# ---------------------------------------------------------------------------------------
# Embedding.
@register("embedding.default")
def embedding(sig, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@register("embedding_renorm.default")  # nn.Embedding(max_norm=...): rows looked up are renormed in place
def embedding_renorm(sig, weight, indices, max_norm, norm_type):
    idx = indices.reshape(-1)
    rows = _f(jnp.take(weight, idx, axis=0))
    a = jnp.abs(rows)
    if norm_type == math.inf:
        norms = jnp.max(a, axis=-1)
    elif norm_type == 2:
        norms = jnp.sqrt(jnp.sum(a * a, axis=-1))
    else:
        norms = jnp.sum(a ** norm_type, axis=-1) ** (1.0 / norm_type)
    # PyTorch's CPU kernel: scale = max_norm / (norm + 1e-7) in double, applied in the row's dtype
    scale = (max_norm / (norms.astype(jnp.float64) + 1e-7)).astype(rows.dtype)
    scaled = jnp.where((norms > max_norm)[:, None], rows * scale[:, None], rows)
    return weight.at[idx].set(scaled.astype(weight.dtype))  # repeated indices write the same row


@register("embedding_dense_backward.default")
def embedding_dense_backward(sig, grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    grad = _f(grad)
    idx = indices.reshape(-1)
    g = grad.reshape((idx.shape[0], grad.shape[-1]))
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[idx].add(1)
        g = g / counts[idx][:, None]
    # PyTorch skips rows equal to padding_idx (-1 matches no valid index)
    g = jnp.where((idx == padding_idx)[:, None], 0, g)
    return jnp.zeros((num_weights, g.shape[1]), g.dtype).at[idx].add(g)


# ---------------------------------------------------------------------------------------
# Activations. Smooth ones differentiate their forward; piecewise ones use PyTorch's
# formulas, which fix the value at the kinks.
def _gelu(x, approximate):
    if approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        return 0.5 * x * (1 + jnp.tanh(k * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1 + lax.erf(x * (1 / math.sqrt(2.0))))


def _silu(x):
    return x * jax.nn.sigmoid(x)


@register("gelu.default")
def gelu(sig, x, approximate="none"):
    return _gelu(_f(x), approximate)


@register("gelu_backward.default")
def gelu_backward(sig, grad, x, approximate="none"):
    return _vjp(lambda x_: _gelu(x_, approximate), (_f(x),), _f(grad))[0]


@register("silu.default")
def silu(sig, x):
    return _silu(_f(x))


@register("silu_backward.default")
def silu_backward(sig, grad, x):
    return _vjp(_silu, (_f(x),), _f(grad))[0]


@register("hardtanh.default")
def hardtanh(sig, x, min_val=-1, max_val=1):
    x = _f(x)
    return jnp.minimum(jnp.maximum(x, _s(min_val, x)), _s(max_val, x))


@register("hardtanh_backward.default")
def hardtanh_backward(sig, grad, x, min_val, max_val):
    grad, x = _f(grad), _f(x)
    return jnp.where((x <= _s(min_val, x)) | (x >= _s(max_val, x)), 0, grad)


@register("leaky_relu.default")
def leaky_relu(sig, x, negative_slope=0.01):
    x = _f(x)
    return jnp.where(x > 0, x, x * _s(negative_slope, x))


@register("leaky_relu_backward.default")
def leaky_relu_backward(sig, grad, x, negative_slope, self_is_result):
    grad, x = _f(grad), _f(x)
    return jnp.where(x > 0, grad, grad * _s(negative_slope, grad))


@register("elu.default")
def elu(sig, x, alpha=1, scale=1, input_scale=1):
    x = _f(x)
    neg = jnp.expm1(x * _s(input_scale, x)) * (_s(alpha, x) * _s(scale, x))
    return jnp.where(x <= 0, neg, x * _s(scale, x))


@register("elu_backward.default")
def elu_backward(sig, grad, alpha, scale, input_scale, is_result, self_or_result):
    grad, y = _f(grad), _f(self_or_result)
    negcoef, poscoef, negip = _s(alpha, y) * _s(scale, y), _s(scale, y), _s(input_scale, y)
    if is_result:
        neg = grad * negip * (y + negcoef)
    else:
        neg = grad * negip * negcoef * jnp.exp(y * negip)
    return jnp.where(y <= 0, neg, grad * poscoef)


@register("softplus.default")
def softplus(sig, x, beta=1, threshold=20):
    x = _f(x)
    bx = x * _s(beta, x)
    return jnp.where(bx > _s(threshold, x), x, jnp.log1p(jnp.exp(bx)) / _s(beta, x))


@register("softplus_backward.default")
def softplus_backward(sig, grad, x, beta, threshold):
    grad, x = _f(grad), _f(x)
    bx = x * _s(beta, x)
    z = jnp.exp(bx)
    return jnp.where(bx > _s(threshold, x), grad, grad * z / (z + 1))


@register("threshold_backward.default")
def threshold_backward(sig, grad, x, threshold):
    grad, x = _f(grad), _f(x)
    return jnp.where(x <= _s(threshold, x), 0, grad)


@register("sigmoid_backward.default")
def sigmoid_backward(sig, grad, out):
    grad, out = _f(grad), _f(out)
    return grad * (1 - out) * out


@register("tanh_backward.default")
def tanh_backward(sig, grad, out):
    grad, out = _f(grad), _f(out)
    return grad * (1 - out * out)


def _relu6_of_shift(x):
    return jnp.clip(x + 3, 0, 6)


@register("hardsigmoid.default")
def hardsigmoid(sig, x):
    x = _f(x)
    return _relu6_of_shift(x) / 6


@register("hardswish.default")
def hardswish(sig, x):
    x = _f(x)
    return x * _relu6_of_shift(x) / 6


@register("_prelu_kernel.default")
def prelu_kernel(sig, x, weight):
    x, weight = _f(x), _f(weight)
    return jnp.where(x > 0, x, weight * x)


@register("glu.default")
def glu(sig, x, dim=-1):
    a, b = jnp.split(_f(x), 2, axis=dim)
    return a * jax.nn.sigmoid(b)
