"""Batch norm through PyTorch's decompositions, with the CPU kernel's saved statistics.

PyTorch's eager kernels return empty saved mean and inverse std when not training (the
backward then uses the running statistics); its decompositions return them at full size.
Wrapped here, lazyxla returns what eager returns. Touches only the decomposition table.
"""
from __future__ import annotations

import torch

from .registry import DECOMPOSITIONS

aten = torch.ops.aten


def _eval_saves_empty(op, training_at):
    decomposition = DECOMPOSITIONS[op]

    def decompose(*args, **kwargs):
        out, save_mean, save_rstd = decomposition(*args, **kwargs)
        training = True if training_at is None else (args[training_at] if len(args) > training_at
                                                     else kwargs["training"])
        if training:
            return out, save_mean, save_rstd
        return out, save_mean.new_empty((0,)), save_rstd.new_empty((0,))

    DECOMPOSITIONS[op] = decompose


_eval_saves_empty(aten.native_batch_norm.default, 5)
_eval_saves_empty(aten._native_batch_norm_legit.default, 5)
DECOMPOSITIONS[aten._native_batch_norm_legit_no_training.default] = (
    lambda input, weight, bias, running_mean, running_var, momentum, eps: DECOMPOSITIONS[
        aten._native_batch_norm_legit.default](input, weight, bias, running_mean, running_var, False, momentum, eps))
