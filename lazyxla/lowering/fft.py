"""FFTs with PyTorch's normalization codes (0 none, 1 by 1/sqrt(n), 2 by 1/n): complex to
complex (``_fft_c2c``, forward or inverse), real to complex (``_fft_r2c``) and complex to
real (``_fft_c2r``), each over any set of dims; and the conjugations PyTorch's inverse and
Hermitian FFTs wrap around them (``_conj``, ``_conj_physical``). Touches only the registry.

PyTorch scales only by the normalization code (the Python layer picks the code from the
direction and ``norm=``), so each transform here is taken unscaled and then scaled.
``_fft_c2r`` reads the last dim of ``dim`` as the halved (Hermitian) one, as ``irfftn``.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from .registry import register


def _fft_scale(n, normalization):
    return 1.0 if normalization == 0 else (1.0 / math.sqrt(n) if normalization == 1 else 1.0 / n)


def _axes(x, dim):
    return tuple(d % x.ndim for d in dim)


def _numel(sizes):
    return int(np.prod(sizes, dtype=np.int64))


@register("_fft_c2c.default")
def fft_c2c(sig, x, dim, normalization, forward):
    axes = _axes(x, dim)
    if not axes:
        return x
    n = _numel([x.shape[a] for a in axes])
    if forward:
        out = jnp.fft.fftn(x, axes=axes)
    else:
        out = jnp.fft.ifftn(x, axes=axes) * n  # ifftn scales by 1/n: undone
    return out * _fft_scale(n, normalization)


@register("_fft_r2c.default")
def fft_r2c(sig, x, dim, normalization, onesided):
    axes = _axes(x, dim)
    n = _numel([x.shape[a] for a in axes])
    out = jnp.fft.rfftn(x, axes=axes) if onesided else jnp.fft.fftn(x, axes=axes)
    return out * _fft_scale(n, normalization)


@register("_fft_c2r.default")
def fft_c2r(sig, x, dim, normalization, last_dim_size):
    axes = _axes(x, dim)
    s = [x.shape[a] for a in axes[:-1]] + [last_dim_size]
    n = _numel(s)
    out = jnp.fft.irfftn(x, s=s, axes=axes)  # scaled by 1/n
    return out * (n * _fft_scale(n, normalization))


# ifft, hfft and ihfft conjugate their input or output. ``_conj`` is a view in PyTorch (it
# sets the conjugate bit); on the device its value is the conjugate itself.
@register("_conj.default", "_conj_physical.default", "_conj_copy.default")
def conj(sig, x):
    return jnp.conj(x)
