"""Pairwise distances: ``_cdist_forward``, ``_cdist_backward`` (PyTorch's per-p gradient
formulas; a zero distance gives 0) and ``_pdist_forward``, for any p (0, 1, 2, inf, other).

Half precision is computed in float32, as PyTorch's CPU kernels do. Touches only the registry.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from .nn_helpers import _f
from .registry import register


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
