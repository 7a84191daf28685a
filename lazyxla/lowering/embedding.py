"""Embedding lookups: ``embedding``, ``embedding_renorm`` (``nn.Embedding(max_norm=...)``)
and the dense backward; embedding bags (``_embedding_bag`` and, without autograd,
``_embedding_bag_forward_only``: sum, mean, max) and their backward, for the weight and for
the per-sample weights.

Values follow PyTorch's eager CPU kernels; output shapes come from PyTorch's meta kernels
(``sig.outs``), which follow the non-CPU convention where PyTorch's own devices disagree
(``_embedding_bag``'s workspace outputs). Touches only the registry.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from .nn_helpers import _f
from .program import check_index
from ..xla.widths import long_dtype
from .registry import register


@register("embedding.default")
def embedding(sig, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    n = weight.shape[0]
    check_index(indices, n, f"index out of range in self (index {{value}}, {n} embeddings)", "IndexError")
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
# Embedding bags. offset2bag, bag_size and max_indices are workspaces for the backward; they
# take the meta kernels' (non-CPU) shapes: bag of each index, indices per bag, argmax rows.
_SUM, _MEAN, _MAX = 0, 1, 2


@register("_embedding_bag.default", "_embedding_bag_forward_only.default")  # the latter: no grad needed
def embedding_bag(sig, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    n = indices.shape[0]
    check_index(indices, weight.shape[0], f"an index of input takes value {{value}} which is not in the valid range "
                f"[0, {weight.shape[0]})")
    nb = offsets.shape[0] - (1 if include_last_offset else 0)
    pos = jnp.arange(n)
    if nb > 0:
        # bag of each index: the last bag whose offset is <= its position
        bag = jnp.searchsorted(offsets[:nb], pos, side="right") - 1
    else:
        bag = jnp.zeros((n,), long_dtype())
    end = offsets[nb] if include_last_offset else n
    keep = (bag >= 0) & (pos < end)
    if padding_idx is not None and padding_idx >= 0:
        keep = keep & (indices != padding_idx)
    bag_c = jnp.clip(bag, 0, max(nb - 1, 0))
    rows = _f(weight)[indices]
    wdt = rows.dtype
    if mode == _MAX:
        filled = jnp.where(keep[:, None], rows, -jnp.inf)
        out = jax.ops.segment_max(filled, bag_c, num_segments=nb)
        cnt = jax.ops.segment_sum(keep.astype(long_dtype()), bag_c, num_segments=nb)
        out = jnp.where(cnt[:, None] > 0, out, 0).astype(wdt)
        # argmax row: the first index of the bag reaching the maximum
        hit = keep[:, None] & (rows == out[bag_c])
        big = jnp.iinfo(pos.dtype).max
        first = jax.ops.segment_min(jnp.where(hit, pos[:, None], big), bag_c, num_segments=nb)
        max_idx = jnp.where(first == big, -1, indices[jnp.clip(first, 0, max(n - 1, 0))])
    else:
        if per_sample_weights is not None:
            rows = rows * _f(per_sample_weights)[:, None].astype(wdt)
        rows = jnp.where(keep[:, None], rows, 0)
        out = jax.ops.segment_sum(rows, bag_c, num_segments=nb)
        cnt = jax.ops.segment_sum(keep.astype(long_dtype()), bag_c, num_segments=nb)
        if mode == _MEAN:
            out = out / jnp.maximum(cnt, 1)[:, None].astype(wdt)
        max_idx = jnp.zeros(sig.outs[3].shape, long_dtype())
    sizes = jnp.zeros(sig.outs[2].shape, long_dtype())
    sizes = sizes.at[:nb].set(cnt) if nb else sizes
    o2b = bag_c if sig.outs[1].shape == (n,) else jnp.zeros(sig.outs[1].shape, long_dtype())
    return out, o2b, sizes, max_idx


@register("_embedding_bag_backward.default")
def embedding_bag_backward(sig, grad, indices, offsets, offset2bag, bag_size, maximum_indices,
                           num_weights, scale_grad_by_freq, mode, sparse, per_sample_weights,
                           padding_idx=-1):
    """The weight's gradient, from the workspaces ``_embedding_bag`` above returns."""
    grad = _f(grad)
    d = grad.shape[-1]
    gw = jnp.zeros((num_weights, d), grad.dtype)
    if mode == _MAX:
        nb = maximum_indices.shape[0]
        rows = jnp.where(maximum_indices >= 0, maximum_indices, num_weights)  # -1: dropped
        cols = jnp.broadcast_to(jnp.arange(d), (nb, d))
        return gw.at[rows, cols].add(grad[:nb], mode="drop")
    keep = indices != padding_idx if padding_idx is not None and padding_idx >= 0 else \
        jnp.ones(indices.shape, bool)
    g = grad[offset2bag]
    if mode == _MEAN:
        g = g / jnp.maximum(bag_size[offset2bag], 1)[:, None].astype(g.dtype)
    if per_sample_weights is not None:
        g = g * _f(per_sample_weights)[:, None].astype(g.dtype)
    if scale_grad_by_freq:
        freq = jnp.zeros((num_weights,), long_dtype()).at[indices].add(keep.astype(long_dtype()))
        g = g / jnp.maximum(freq[indices], 1)[:, None].astype(g.dtype)
    return gw.at[indices].add(jnp.where(keep[:, None], g, 0))


@register("_embedding_bag_per_sample_weights_backward.default")
def embedding_bag_per_sample_weights_backward(sig, grad, weight, indices, offsets, offset2bag, mode,
                                              padding_idx=-1):
    """The per-sample weights' gradient (mode sum): each index's row of the weight dotted
    with its bag's output gradient; 0 for the padding index."""
    n = indices.shape[0]
    if offset2bag.shape == (n,):
        bag = offset2bag
    else:
        bag = jnp.searchsorted(offsets, jnp.arange(n), side="right") - 1
    bag = jnp.clip(bag, 0, max(grad.shape[0] - 1, 0))
    g = jnp.sum(_f(grad)[bag] * _f(weight)[indices], axis=-1)
    if padding_idx is not None and padding_idx >= 0:
        g = jnp.where(indices == padding_idx, 0, g)
    return g
