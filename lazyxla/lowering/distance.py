"""Pairwise distances: ``_cdist_forward``, ``_cdist_backward``, ``_pdist_forward`` and
``_pdist_backward`` (PyTorch's per-p gradient formulas; a zero distance gives 0), for any p
(0, 1, 2, inf, other).

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


def _term(diff, d, p):
    """d dist / d diff per element, PyTorch's CPU formulas per p; a zero distance gives 0."""
    safe = jnp.where(d == 0, 1, d)
    if p == 0:
        return jnp.zeros_like(diff)
    if p == 1:
        return jnp.sign(diff)
    if p == 2:
        return jnp.where(d == 0, 0, diff / safe)
    if math.isinf(p):
        return jnp.sign(diff) * (jnp.abs(diff) == d)
    if p < 2:
        return jnp.where((d == 0) | ((diff == 0) & (p < 1)), 0,
                         jnp.sign(diff) * jnp.abs(diff) ** (p - 1) / safe ** (p - 1))
    return jnp.where(d == 0, 0, diff * jnp.abs(diff) ** (p - 2) / safe ** (p - 1))


@register("_cdist_backward.default")
def cdist_backward(sig, grad, x1, x2, p, cdist):
    """Gradient for x1 with PyTorch's CPU formulas per p; a zero distance gives 0, not 0/0."""
    g, x1, x2, dist = _f(grad), _f(x1), _f(x2), _f(cdist)
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    return jnp.sum(g[..., None] * _term(diff, dist[..., None], float(p)), axis=-2)


@register("_pdist_backward.default")
def pdist_backward(sig, grad, x, p, pdist):
    """Each pair's term added to its first row and taken from its second."""
    n = x.shape[0]
    i, j = np.triu_indices(n, 1)
    g, xf, dist = _f(grad), _f(x), _f(pdist)
    t = g[:, None] * _term(xf[i] - xf[j], dist[:, None], float(p))
    return jnp.zeros_like(xf).at[i].add(t).at[j].add(-t)


@register("_pdist_forward.default")
def pdist_forward(sig, x, p=2):
    n = x.shape[0]
    i, j = np.triu_indices(n, 1)
    x = _f(x)
    return _pnorm(x[i] - x[j], float(p))
