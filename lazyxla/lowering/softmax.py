"""Softmax and log-softmax along a dim, and their backward ops (0-d inputs are 1-element
vectors). Touches only the registry.
"""
from __future__ import annotations

import jax.numpy as jnp

from .nn_helpers import _f
from .registry import register


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
