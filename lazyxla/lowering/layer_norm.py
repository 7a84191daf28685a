"""Layer norm (``native_layer_norm``) and its backward, with PyTorch's mean and rstd
outputs in the CPU kernel's dtype (``stats_dtype``, shared with the batch and group norms).
Touches only the registry.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from .nn_helpers import _f, _masked, _s
from .registry import output_dtypes, register


def stats_dtype(x, *params):
    """The dtype of a norm's saved statistics on PyTorch's CPU: float32 for a half-precision
    input with a float32 parameter (weight, bias, running statistics), else the input's own
    (its meta kernel says float32 for every half-precision input)."""
    half = x.dtype in (torch.float16, torch.bfloat16)
    if half and any(p is not None and p.dtype == torch.float32 for p in params):
        return torch.float32
    return x.dtype


@output_dtypes("native_layer_norm.default")
def _layer_norm_dtypes(x, normalized_shape, weight, bias, eps):
    d = stats_dtype(x, weight, bias)
    return (None, d, d)


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
