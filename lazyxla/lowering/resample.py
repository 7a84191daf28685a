"""Resampling: ``F.interpolate`` and ``F.grid_sample``.

- nearest and bilinear 2-d upsampling and their backward; the backward ops of the other
  modes (nearest and nearest-exact 1-d/2-d/3-d, linear 1-d, trilinear 3-d, bicubic 2-d),
  whose forward ops are PyTorch decompositions;
- antialiased bilinear, bicubic and Lanczos 2-d resampling (``_upsample_*2d_aa``,
  ``antialias=True``: PIL's separable filters) and their backward;
- sampling at grid points: ``grid_sampler_3d`` (trilinear, nearest) and the backward of
  the 2-d (also bicubic; its forward is PyTorch's decomposition) and 3-d samplers.

Source indices and weights are computed on the host the way PyTorch's CPU kernels do (in
float32 for float32 and half inputs), so forward and backward (the vjp of the forward, a
scatter-add) pick the same pixels. Touches only the registry.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..xla.widths import long_dtype
from ..xla import precision
from .nn_helpers import _f, _masked, _vjp
from .registry import register

_WEIGHTS = precision.of("weights")  # HIGHEST at every setting: the weights must not round


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
    """(index0, index1, lambda0, lambda1) per output position (PyTorch's
    ``compute_source_index_and_lambda``: equal sizes copy; the index is guarded)."""
    o = np.arange(n_out)
    if n_in == n_out:
        return o, o, np.ones(n_out, ftype), np.zeros(n_out, ftype)
    s = _scale(n_in, n_out, align_corners, scale, ftype)
    of = o.astype(ftype)
    src = s * of if align_corners else np.maximum(s * (of + ftype(0.5)) - ftype(0.5), ftype(0))
    i0 = np.minimum(src.astype(np.int64), n_in - 1)
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


# -- separable resampling along the last dims: the backward ops of F.interpolate ----------
# (the forward ops are PyTorch decompositions; each backward is the vjp of the same taps)
_CUBIC_A = -0.75


def _taps(kind, n_in, n_out, align_corners, scale, ftype):
    """[(indices, weights or None)] per output position along one dim, as PyTorch's CPU
    kernels pick them: nearest (``floor(o * s)``, exact copies for 1x and 2x), nearest-exact
    (``floor((o + 0.5) * s)``), linear (two taps), cubic (four taps, A = -0.75, clamped)."""
    o = np.arange(n_out)
    if kind == "nearest":
        return [(_nearest_index(n_in, n_out, scale), None)]
    if kind == "nearest-exact":
        s = _scale(n_in, n_out, False, scale, np.float32)
        idx = np.floor((o.astype(np.float32) + np.float32(0.5)) * s).astype(np.int64)
        return [(np.minimum(idx, n_in - 1), None)]
    if kind == "linear":
        i0, i1, l0, l1 = _linear_weights(n_in, n_out, align_corners, scale, ftype)
        return [(i0, l0), (i1, l1)]
    s = _scale(n_in, n_out, align_corners, scale, ftype)
    of = o.astype(ftype)
    src = s * of if align_corners else s * (of + ftype(0.5)) - ftype(0.5)
    base = np.floor(src)
    t = (src - base).astype(ftype)
    a = ftype(_CUBIC_A)
    c1 = lambda x: ((a + 2) * x - (a + 3)) * x * x + 1
    c2 = lambda x: ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    ws = [c2(t + 1), c1(t), c1(1 - t), c2(2 - t)]
    return [(np.clip(base.astype(np.int64) - 1 + k, 0, n_in - 1), w.astype(ftype)) for k, w in enumerate(ws)]


def _resample(x, kind, out_sizes, align_corners, scales):
    """x resampled along its last len(out_sizes) dims, one dim at a time."""
    ftype = np.float64 if x.dtype == jnp.float64 else np.float32
    k = len(out_sizes)
    for i, (n_out, sc) in enumerate(zip(out_sizes, scales)):
        ax = x.ndim - k + i
        shape = [1] * x.ndim
        shape[ax] = n_out
        y = None
        for idx, w in _taps(kind, x.shape[ax], n_out, align_corners, sc, ftype):
            t = jnp.take(x, jnp.asarray(idx), axis=ax)
            if w is not None:
                t = t * jnp.asarray(w, x.dtype).reshape(shape)
            y = t if y is None else y + t
        x = y
    return x


def _resample_backward(grad, input_size, kind, align_corners, scales):
    g = _f(grad)
    k = len(scales)
    out_sizes = tuple(g.shape[-k:])
    x0 = jnp.zeros(tuple(input_size), g.dtype)
    return _vjp(lambda x_: _resample(x_, kind, out_sizes, align_corners, scales), (x0,), g)[0]


@register("upsample_nearest1d_backward.default")
def upsample_nearest1d_backward(sig, grad, output_size, input_size, scales=None):
    return _resample_backward(grad, input_size, "nearest", False, (scales,))


@register("upsample_nearest3d_backward.default")
def upsample_nearest3d_backward(sig, grad, output_size, input_size, scales_d=None, scales_h=None, scales_w=None):
    return _resample_backward(grad, input_size, "nearest", False, (scales_d, scales_h, scales_w))


@register("_upsample_nearest_exact1d_backward.default")
def upsample_nearest_exact1d_backward(sig, grad, output_size, input_size, scales=None):
    return _resample_backward(grad, input_size, "nearest-exact", False, (scales,))


@register("_upsample_nearest_exact2d_backward.default")
def upsample_nearest_exact2d_backward(sig, grad, output_size, input_size, scales_h=None, scales_w=None):
    return _resample_backward(grad, input_size, "nearest-exact", False, (scales_h, scales_w))


@register("_upsample_nearest_exact3d_backward.default")
def upsample_nearest_exact3d_backward(sig, grad, output_size, input_size, scales_d=None, scales_h=None,
                                      scales_w=None):
    return _resample_backward(grad, input_size, "nearest-exact", False, (scales_d, scales_h, scales_w))


@register("upsample_linear1d_backward.default")
def upsample_linear1d_backward(sig, grad, output_size, input_size, align_corners, scales=None):
    return _resample_backward(grad, input_size, "linear", align_corners, (scales,))


@register("upsample_trilinear3d_backward.default")
def upsample_trilinear3d_backward(sig, grad, output_size, input_size, align_corners, scales_d=None,
                                  scales_h=None, scales_w=None):
    return _resample_backward(grad, input_size, "linear", align_corners, (scales_d, scales_h, scales_w))


@register("upsample_bicubic2d_backward.default")
def upsample_bicubic2d_backward(sig, grad, output_size, input_size, align_corners, scales_h=None,
                                scales_w=None):
    return _resample_backward(grad, input_size, "cubic", align_corners, (scales_h, scales_w))


# -- antialiased resampling (PIL's separable filters, as PyTorch's CPU kernel) --------------
_AA_TAPS = {"bilinear": 2, "bicubic": 4, "lanczos": 6}


def _sinc(x):
    return np.where(x == 0, 1.0, np.sin(np.pi * x) / np.where(x == 0, 1.0, np.pi * x))


def _aa_filter(kind):
    if kind == "bilinear":
        return lambda x: np.maximum(1.0 - np.abs(x), 0.0)
    if kind == "lanczos":   # a = 3
        return lambda x: np.where(np.abs(x) < 3, _sinc(x) * _sinc(x / 3), 0.0)
    a = -0.5

    def cubic(x):
        x = np.abs(x)
        return np.where(x < 1.0, ((a + 2.0) * x - (a + 3.0)) * x * x + 1,
                        np.where(x < 2.0, (((x - 5) * x + 8) * x - 4) * a, 0.0))
    return cubic


def _aa_matrix(n_in, n_out, align_corners, scale, kind):
    """[n_out, n_in] weights: each output's window around its center, filter weights
    normalized to sum 1 (PyTorch's ``_compute_weights_aa``)."""
    interp = _AA_TAPS[kind]
    if align_corners:
        s = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    else:
        s = 1.0 / scale if scale is not None and scale > 0 else n_in / n_out
    support = interp * 0.5 * s if s >= 1.0 else interp * 0.5
    inv = 1.0 / s if s >= 1.0 else 1.0
    filt = _aa_filter(kind)
    m = np.zeros((n_out, n_in))
    max_size = int(np.ceil(support)) * 2 + 1
    for i in range(n_out):
        center = s * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        size = min(max(min(int(center + support + 0.5), n_in) - lo, 0), max_size)
        j = np.arange(size)
        w = filt((j + lo - center + 0.5) * inv)
        total = w.sum()
        m[i, lo:lo + size] = w / total if total != 0 else w
    return m


def _aa_resample(x, out_hw, align_corners, scales, kind):
    mh = _aa_matrix(x.shape[-2], out_hw[0], align_corners, scales[0], kind)
    mw = _aa_matrix(x.shape[-1], out_hw[1], align_corners, scales[1], kind)
    c = lambda m: jnp.asarray(m, x.dtype)
    return jnp.einsum("oh,...hw,pw->...op", c(mh), x, c(mw), precision=_WEIGHTS)


def _aa_backward(grad, input_size, align_corners, scales, kind):
    g = _f(grad)
    mh = _aa_matrix(input_size[-2], g.shape[-2], align_corners, scales[0], kind)
    mw = _aa_matrix(input_size[-1], g.shape[-1], align_corners, scales[1], kind)
    c = lambda m: jnp.asarray(m, g.dtype)
    return jnp.einsum("oh,...op,pw->...hw", c(mh), g, c(mw), precision=_WEIGHTS)


@register("_upsample_bilinear2d_aa.default")
def upsample_bilinear2d_aa(sig, x, output_size, align_corners, scales_h=None, scales_w=None):
    return _aa_resample(_f(x), tuple(sig.outs[0].shape[-2:]), align_corners, (scales_h, scales_w), "bilinear")


@register("_upsample_bicubic2d_aa.default")
def upsample_bicubic2d_aa(sig, x, output_size, align_corners, scales_h=None, scales_w=None):
    return _aa_resample(_f(x), tuple(sig.outs[0].shape[-2:]), align_corners, (scales_h, scales_w), "bicubic")


@register("_upsample_lanczos2d_aa.default")
def upsample_lanczos2d_aa(sig, x, output_size, align_corners, scales_h=None, scales_w=None):
    return _aa_resample(_f(x), tuple(sig.outs[0].shape[-2:]), align_corners, (scales_h, scales_w), "lanczos")


@register("_upsample_lanczos2d_aa_backward.default")
def upsample_lanczos2d_aa_backward(sig, grad, output_size, input_size, align_corners, scales_h=None,
                                   scales_w=None):
    return _aa_backward(grad, input_size, align_corners, (scales_h, scales_w), "lanczos")


@register("_upsample_bilinear2d_aa_backward.default")
def upsample_bilinear2d_aa_backward(sig, grad, output_size, input_size, align_corners, scales_h=None,
                                    scales_w=None):
    return _aa_backward(grad, input_size, align_corners, (scales_h, scales_w), "bilinear")


@register("_upsample_bicubic2d_aa_backward.default")
def upsample_bicubic2d_aa_backward(sig, grad, output_size, input_size, align_corners, scales_h=None,
                                   scales_w=None):
    return _aa_backward(grad, input_size, align_corners, (scales_h, scales_w), "bicubic")


# -- sampling at grid points (PyTorch's GridSampler.h) -------------------------------------
_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _clip(c, size):
    """Into [0, size - 1] as C's min(size - 1, max(c, 0)) (NaN becomes size - 1); the
    gradient is 1 strictly inside and 0 on and beyond the bounds."""
    hi = size - 1
    return jnp.where(jnp.isnan(c) | (c >= hi), hi, jnp.where(c <= 0, 0, c)).astype(c.dtype)


def _reflect(c, twice_low, twice_high):
    if twice_low == twice_high:
        return jnp.zeros_like(c)
    lo, span = twice_low / 2, (twice_high - twice_low) / 2
    c = c - lo
    c = jnp.where(c < 0, -c, c)   # |c|, with PyTorch's gradient +1 at 0
    extra = jnp.fmod(c, span)
    even = jnp.fmod(jnp.floor(c / span), 2) == 0
    return jnp.where(even, extra + lo, span - extra + lo)


def _source_index(coord, size, padding, align_corners):
    """PyTorch's ``grid_sampler_compute_source_index``: unnormalize, pad, and send a
    non-finite or huge coordinate far out of bounds (-100)."""
    if align_corners:
        c = (coord + 1) / 2 * (size - 1)
    else:
        c = ((coord + 1) * size - 1) / 2
    if padding == _BORDER:
        c = _clip(c, size)
    elif padding == _REFLECTION:
        c = _reflect(c, 0, 2 * (size - 1)) if align_corners else _reflect(c, -1, 2 * size - 1)
        c = _clip(c, size)
    ok = jnp.isfinite(c) & (c <= 2147483646) & (c >= -2147483648)
    return jnp.where(ok, c, -100.0).astype(c.dtype)


def _grid_sample(x, grid, mode, padding, align_corners):
    """x [N, C, *S] (S: 2 or 3 spatial sizes), grid [N, *O, len(S)] (x first) -> [N, C, *O]."""
    nd = x.ndim - 2
    sizes = x.shape[2:]
    n, c = x.shape[:2]
    out_sp = grid.shape[1:-1]
    flat = x.reshape(n, c, -1)
    # coordinates per spatial dim, outermost first (grid holds x, y[, z])
    coords = [_source_index(grid[..., nd - 1 - d].reshape(n, -1), sizes[d], padding, align_corners)
              for d in range(nd)]

    def gather(ints):
        inside = jnp.ones(ints[0].shape, bool)
        lin = jnp.zeros(ints[0].shape, long_dtype())
        for i, sz in zip(ints, sizes):
            inside = inside & (i >= 0) & (i < sz)
            lin = lin * sz + jnp.clip(i, 0, sz - 1)
        vals = jnp.take_along_axis(flat, lin[:, None, :], axis=2)
        return vals, inside[:, None, :]

    if mode == _NEAREST:
        vals, inside = gather([jnp.round(cc).astype(long_dtype()) for cc in coords])
        out = jnp.where(inside, vals, 0)
    elif mode == _BICUBIC:   # 2-d only: 4 x 4 neighbours, each padded on its own
        return _grid_bicubic(flat, grid, sizes, padding, align_corners, gather).reshape((n, c) + tuple(out_sp))
    else:
        lows = [jnp.floor(cc) for cc in coords]
        out = jnp.zeros((n, c, coords[0].shape[1]), x.dtype)
        for bits in np.ndindex(*(2,) * nd):   # corners in PyTorch's order (tnw, tne, tsw, ...)
            w = None
            for bit, cc, lo in zip(bits, coords, lows):
                f = (cc - lo) if bit else (lo + 1 - cc)
                w = f if w is None else w * f
            vals, inside = gather([(lo + bit).astype(long_dtype()) for bit, lo in zip(bits, lows)])
            out = out + jnp.where(inside, vals * w[:, None, :], 0)
    return out.reshape((n, c) + tuple(out_sp))


def _grid_bicubic(flat, grid, sizes, padding, align_corners, gather):
    """PyTorch's bicubic grid sampling: unnormalized (not padded) coordinates, cubic
    convolution (A = -0.75) over the 4 x 4 neighbours of floor(coordinate), each neighbour's
    coordinate padded and read as 0 out of bounds."""
    n = flat.shape[0]
    (h, w) = sizes
    unnorm = (lambda cc, size: (cc + 1) / 2 * (size - 1)) if align_corners else \
        (lambda cc, size: ((cc + 1) * size - 1) / 2)
    ix = unnorm(grid[..., 0].reshape(n, -1), w)
    iy = unnorm(grid[..., 1].reshape(n, -1), h)
    x0, y0 = jnp.floor(ix), jnp.floor(iy)
    tx, ty = ix - x0, iy - y0
    a = _CUBIC_A
    c1 = lambda t: ((a + 2) * t - (a + 3)) * t * t + 1
    c2 = lambda t: ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    wx = [c2(tx + 1), c1(tx), c1(1 - tx), c2(2 - tx)]
    wy = [c2(ty + 1), c1(ty), c1(1 - ty), c2(2 - ty)]

    def pad(cc, size):   # compute_coordinates: padding only, then truncation to an index
        if padding == _BORDER:
            cc = _clip(cc, size)
        elif padding == _REFLECTION:
            cc = _reflect(cc, 0, 2 * (size - 1)) if align_corners else _reflect(cc, -1, 2 * size - 1)
            cc = _clip(cc, size)
        return jnp.trunc(cc).astype(long_dtype())

    out = None
    for j in range(4):
        row = None
        for i in range(4):
            vals, inside = gather([pad(y0 - 1 + j, h), pad(x0 - 1 + i, w)])
            term = jnp.where(inside, vals, 0) * wx[i][:, None, :]
            row = term if row is None else row + term
        term = row * wy[j][:, None, :]
        out = term if out is None else out + term
    return out


def _check_mode(mode, nd):
    if mode not in (_BILINEAR, _NEAREST) and not (nd == 2 and mode == _BICUBIC):
        raise NotImplementedError(f"grid_sampler_{nd}d: interpolation mode {mode} is not lowered")


@register("grid_sampler_3d.default")
def grid_sampler_3d(sig, x, grid, interpolation_mode, padding_mode, align_corners):
    _check_mode(interpolation_mode, 3)
    return _grid_sample(_f(x), _f(grid), interpolation_mode, padding_mode, align_corners)


@register("grid_sampler_2d_backward.default", "grid_sampler_3d_backward.default")
def grid_sampler_backward(sig, grad, x, grid, interpolation_mode, padding_mode, align_corners,
                          output_mask):
    """The vjp of the sampling (the 2-d forward itself is PyTorch's decomposition)."""
    _check_mode(interpolation_mode, grid.shape[-1])
    fwd = lambda x_, g_: _grid_sample(x_, g_, interpolation_mode, padding_mode, align_corners)
    gx, gg = _vjp(fwd, (_f(x), _f(grid)), _f(grad))
    return _masked(sig, output_mask, [lambda: gx, lambda: gg])
