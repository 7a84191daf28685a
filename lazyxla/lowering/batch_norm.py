"""Batch and group norm through PyTorch's decompositions, with the CPU kernel's saved statistics.

PyTorch's eager kernels return empty saved mean and inverse std when not training (the
backward then uses the running statistics); its decompositions return them at full size, and
in float32 for a half-precision input where the CPU keeps the input's dtype
(``layer_norm.stats_dtype``). Wrapped here, lazyxla returns what eager returns. Touches only the
decomposition table.
"""
from __future__ import annotations

import torch

from .layer_norm import stats_dtype
from .registry import DECOMPOSITIONS

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
