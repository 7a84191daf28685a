"""Activations and their backward ops: gelu, silu, hardtanh, leaky_relu, softshrink, hardshrink, elu, softplus,
hardsigmoid, hardswish, prelu, glu, and the backward ops of relu (threshold), sigmoid and tanh.

Smooth ones differentiate their forward (vjp); piecewise ones use PyTorch's formulas, which fix
the value at the kinks. Touches only the registry.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from .nn_helpers import _f, _s, _vjp, tanh
from .registry import register


def _gelu(x, approximate):
    if approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        return 0.5 * x * (1 + tanh(k * (x + 0.044715 * x * x * x)))
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


def _inside(x, lambd):
    return (x >= -_s(lambd, x)) & (x <= _s(lambd, x))


@register("softshrink.default")
def softshrink(sig, x, lambd=0.5):
    x = _f(x)
    return jnp.where(x > _s(lambd, x), x - _s(lambd, x), jnp.where(x < -_s(lambd, x), x + _s(lambd, x), 0))


@register("hardshrink.default")
def hardshrink(sig, x, lambd=0.5):
    x = _f(x)
    return jnp.where(_inside(x, lambd), 0, x)


@register("softshrink_backward.default", "hardshrink_backward.default")
def shrink_backward(sig, grad, x, lambd):
    """Both shrinks pass the gradient outside [-lambd, lambd] and stop it inside, ends included."""
    grad, x = _f(grad), _f(x)
    return jnp.where(_inside(x, lambd), 0, grad)


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
