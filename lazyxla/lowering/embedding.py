"""Embedding lookups: ``embedding``, ``embedding_renorm`` (``nn.Embedding(max_norm=...)``)
and the dense backward. Touches only the registry.
"""
from __future__ import annotations

import math

import jax.numpy as jnp

from .nn_helpers import _f
from .registry import register


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
