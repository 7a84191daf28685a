"""FFTs between real and complex (``_fft_r2c``, ``_fft_c2r``) with PyTorch's normalization
codes: 0 none, 1 by 1/sqrt(n), 2 by 1/n. Touches only the registry.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from .registry import register


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
