"""Batch and group norm through PyTorch's decompositions, with the CPU kernel's saved statistics;
batch norm's backward lowered as one node.

PyTorch's eager kernels return empty saved mean and inverse std when not training (the
backward then uses the running statistics); its decompositions return them at full size, and
in float32 for a half-precision input where the CPU keeps the input's dtype
(``layer_norm.stats_dtype``). Wrapped here, lazyxla returns what eager returns.

``native_batch_norm_backward`` has a lowering of its own: its decomposition traced about twenty
ops per call, every step (a ResNet-18 step: 20 of them, a fifth of the step's host time). So
has the training forward with running statistics (``lower_batch_norm_train``, recorded by
``running_stats``: one node that also gives the new running statistics); the other forms stay
decomposed. Touches the decomposition table and the registry.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from ..xla.client import jnp_dtype
from .layer_norm import stats_dtype
from .nn_helpers import _f, _masked, _s
from .registry import DECOMPOSITIONS, register

aten = torch.ops.aten


def _as_cpu(op, training_at, params=(1, 2, 3, 4)):
    """Wrap ``op``'s decomposition: saved statistics in the CPU's dtype (from the input and the
    arguments at ``params``), and empty when ``args[training_at]`` says not training."""
    decomposition = DECOMPOSITIONS[op]

    def decompose(*args, **kwargs):
        out, save_mean, save_rstd, *rest = decomposition(*args, **kwargs)
        dt = stats_dtype(args[0], *(args[i] for i in params if i < len(args)))
        save_mean, save_rstd = save_mean.to(dt), save_rstd.to(dt)
        training = True if training_at is None else (args[training_at] if len(args) > training_at
                                                     else kwargs["training"])
        if not training:
            save_mean, save_rstd = save_mean.new_empty((0,)), save_rstd.new_empty((0,))
        return (out, save_mean, save_rstd, *rest)

    DECOMPOSITIONS[op] = decompose


_as_cpu(aten.native_batch_norm.default, 5)
_as_cpu(aten._native_batch_norm_legit.default, 5)
_as_cpu(aten._native_batch_norm_legit.no_stats, 3, params=(1, 2))
_as_cpu(aten._batch_norm_with_update.default, None)
_as_cpu(aten.native_group_norm.default, None, params=(1, 2))
DECOMPOSITIONS[aten._native_batch_norm_legit_no_training.default] = (
    lambda input, weight, bias, running_mean, running_var, momentum, eps: DECOMPOSITIONS[
        aten._native_batch_norm_legit.default](input, weight, bias, running_mean, running_var, False, momentum, eps))


@register("native_batch_norm_backward.default")
def native_batch_norm_backward(sig, grad, x, weight, running_mean, running_var, save_mean, save_invstd, train,
                               eps, output_mask):
    """Gradients of batch norm over channel dimension 1: training uses the saved batch
    statistics (the input's normalization depends on every element of its channel), evaluation
    the running ones (a per-channel scale). Computed in float32 for half-precision inputs."""
    grad, x = _f(grad), _f(x)
    axes = tuple(i for i in range(x.ndim) if i != 1)
    per_channel = [1] * x.ndim
    per_channel[1] = x.shape[1]
    if train:
        mean, invstd = _f(save_mean), _f(save_invstd)
    else:
        mean, var = _f(running_mean), _f(running_var)
        invstd = lax.rsqrt(var + _s(eps, var))
    n = x.size // x.shape[1]
    centered = x - mean.reshape(per_channel)
    grad_sum = jnp.sum(grad, axes)
    grad_dot = jnp.sum(grad * centered, axes)

    def d_input():
        scale = invstd if weight is None else invstd * _f(weight)
        if not train:
            return grad * scale.reshape(per_channel)
        along = centered * ((grad_dot / n) * (invstd * invstd)).reshape(per_channel)
        return ((grad - along) - (grad_sum / n).reshape(per_channel)) * scale.reshape(per_channel)

    return _masked(sig, tuple(output_mask), [d_input, lambda: grad_dot * invstd, lambda: grad_sum])


def lower_batch_norm_train(sig, x, *rest, has_weight, has_bias, eps):
    """Training batch norm over channel dimension 1 (``running_stats``' node): the output, the
    saved mean and inverse std (the CPU kernel's dtypes, ``sig.outs``), and the new running mean
    and variance: ``momentum * batch + (1 - momentum) * running``, the variance unbiased.
    ``rest``: [weight], [bias], running mean, running variance, momentum (data, the running
    statistics' dtype). Computed in float32 for half-precision inputs, as the CPU does."""
    it = iter(rest)
    weight = next(it) if has_weight else None
    bias = next(it) if has_bias else None
    running_mean, running_var, momentum = next(it), next(it), next(it)
    xf = _f(x)
    axes = tuple(i for i in range(x.ndim) if i != 1)
    per_channel = [1] * x.ndim
    per_channel[1] = x.shape[1]
    n = x.size // x.shape[1]
    mean = jnp.mean(xf, axes)
    centered = xf - mean.reshape(per_channel)
    var = jnp.mean(centered * centered, axes)
    invstd = lax.rsqrt(var + _s(eps, var))
    out = centered * invstd.reshape(per_channel)
    if weight is not None:
        out = out * _f(weight).reshape(per_channel)
    if bias is not None:
        out = out + _f(bias).reshape(per_channel)
    stats = jnp_dtype(sig.outs[1].dtype)
    keep = 1 - momentum
    new_mean = momentum * mean.astype(running_mean.dtype) + keep * running_mean
    new_var = momentum * (var * _s(n / (n - 1), var)).astype(running_var.dtype) + keep * running_var
    return out.astype(x.dtype), mean.astype(stats), invstd.astype(stats), new_mean, new_var
