"""Losses and their backward ops: NLL (1-d and 2-d), MSE, binary cross-entropy, smooth L1
and Huber, with PyTorch's reductions (0 none, 1 mean, 2 sum).

Piecewise backward formulas copy PyTorch's boundary conventions; MSE's backward is the vjp of
its forward. Touches only the registry.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .nn_helpers import _f, _s, _vjp
from .registry import register

_REDUCTION_NONE, _REDUCTION_MEAN, _REDUCTION_SUM = 0, 1, 2


def _reduce(loss, reduction):
    if reduction == _REDUCTION_MEAN:
        return jnp.mean(loss)
    if reduction == _REDUCTION_SUM:
        return jnp.sum(loss)
    return loss


def _loss_norm(grad, x, reduction):
    """Scale of a pointwise loss's backward: 1/numel for mean, 1 otherwise."""
    if reduction == _REDUCTION_MEAN:
        return grad / x.size
    return grad


def _nll_parts(x, target, weight, ignore_index):
    """(class axis, valid mask, safe target, per-element weight with ignored set to 0)."""
    cdim = 1 if x.ndim > 1 else 0
    valid = target != ignore_index
    t = jnp.where(valid, target, 0)
    w = jnp.take(weight, t, axis=0) if weight is not None else jnp.ones(t.shape, x.dtype)
    return cdim, valid, t, jnp.where(valid, w.astype(x.dtype), 0)


def _nll_forward(sig, x, target, weight, reduction, ignore_index):
    x = _f(x)
    cdim, valid, t, w = _nll_parts(x, target, _f(weight), ignore_index)
    picked = jnp.take_along_axis(x, jnp.expand_dims(t, cdim), axis=cdim).squeeze(cdim)
    losses = jnp.where(valid, -picked * w, 0)
    if reduction == _REDUCTION_NONE and x.ndim > 1:
        return losses, jnp.zeros((), x.dtype)  # PyTorch leaves total_weight at 0 here
    total = jnp.sum(w)
    loss = jnp.sum(losses)
    return (loss / total if reduction == _REDUCTION_MEAN else loss), total


def _nll_backward(sig, grad, x, target, weight, reduction, ignore_index, total_weight):
    x, grad = _f(x), _f(grad)
    cdim, valid, t, w = _nll_parts(x, target, _f(weight), ignore_index)
    if reduction == _REDUCTION_MEAN:
        grad = grad / total_weight.astype(x.dtype)
    coef = jnp.where(valid, -w * grad, 0)
    onehot = jax.nn.one_hot(t, x.shape[cdim], dtype=x.dtype, axis=cdim)
    return onehot * jnp.expand_dims(coef, cdim)


register("nll_loss_forward.default", "nll_loss2d_forward.default")(_nll_forward)


register("nll_loss_backward.default", "nll_loss2d_backward.default")(_nll_backward)


def _mse(x, t, reduction):
    return _reduce((x - t) ** 2, reduction)


@register("mse_loss.default")
def mse_loss(sig, x, t, reduction=_REDUCTION_MEAN):
    return _mse(_f(x), _f(t), reduction)


@register("mse_loss_backward.default")
def mse_loss_backward(sig, grad, x, t, reduction):
    t = _f(t)
    return _vjp(lambda x_: _mse(x_, t, reduction), (_f(x),), _f(grad))[0]


_BCE_EPS = 1e-12  # PyTorch's floor for x * (1 - x) in the BCE backward


@register("binary_cross_entropy.default")
def binary_cross_entropy(sig, x, t, weight=None, reduction=_REDUCTION_MEAN):
    x, t = _f(x), _f(t)
    floor = _s(-100, x)  # PyTorch clamps the logs at -100
    loss = (t - 1) * jnp.maximum(jnp.log1p(-x), floor) - t * jnp.maximum(jnp.log(x), floor)
    if weight is not None:
        loss = loss * _f(weight)
    return _reduce(loss, reduction)


@register("binary_cross_entropy_backward.default")
def binary_cross_entropy_backward(sig, grad, x, t, weight=None, reduction=_REDUCTION_MEAN):
    x, t, grad = _f(x), _f(t), _f(grad)
    g = _loss_norm(grad, x, reduction) * (x - t) / jnp.maximum((1 - x) * x, _s(_BCE_EPS, x))
    if weight is not None:
        g = g * _f(weight)
    return g


@register("smooth_l1_loss.default")
def smooth_l1_loss(sig, x, t, reduction=_REDUCTION_MEAN, beta=1.0):
    z = jnp.abs(_f(x) - _f(t))
    loss = z - 0.5 * beta if beta == 0 else jnp.where(z < beta, 0.5 * z * z / beta, z - 0.5 * beta)
    return _reduce(loss, reduction)


@register("smooth_l1_loss_backward.default")
def smooth_l1_loss_backward(sig, grad, x, t, reduction, beta):
    x, t, grad = _f(x), _f(t), _f(grad)
    d = x - t
    g = _loss_norm(grad, x, reduction)
    inner = d * g / beta if beta != 0 else jnp.zeros_like(d)
    return jnp.where(d <= -beta, -g, jnp.where(d >= beta, g, inner))


@register("huber_loss.default")
def huber_loss(sig, x, t, reduction=_REDUCTION_MEAN, delta=1.0):
    z = jnp.abs(_f(x) - _f(t))
    return _reduce(jnp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta)), reduction)


@register("huber_loss_backward.default")
def huber_loss_backward(sig, grad, x, t, reduction, delta):
    x, t, grad = _f(x), _f(t), _f(grad)
    d = x - t
    g = _loss_norm(grad, x, reduction)
    return jnp.where(d <= -delta, -g * delta, jnp.where(d >= delta, g * delta, d * g))
