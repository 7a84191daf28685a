"""The gradient scaler's two ops (``torch.amp.GradScaler``), recorded through other ops.

``_amp_foreach_non_finite_check_and_unscale_`` and ``_amp_update_scale_`` write their
arguments in place and have no PyTorch decomposition. Written here with ordinary tensor ops
(which lazyxla records), they keep the scaler's bookkeeping on the device: a step with an
inf or NaN gradient is skipped and the scale backs off without reading anything to the host,
with the semantics of PyTorch's CPU kernels. Registered as decompositions on import; touches
nothing else.
"""
from __future__ import annotations

import torch

from .registry import DECOMPOSITIONS

aten = torch.ops.aten


def non_finite_check_and_unscale_(grads, found_inf, inv_scale):
    """found_inf becomes 1 if any gradient has an inf or NaN; every gradient is multiplied by
    inv_scale (found_inf and inv_scale: 1-element float tensors)."""
    for g in grads:
        bad = torch.logical_not(torch.isfinite(g)).any().to(found_inf.dtype).reshape(found_inf.shape)
        found_inf.copy_(torch.maximum(found_inf, bad))
        g.mul_(inv_scale.to(g.dtype))


def update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    """After an inf/NaN step the scale backs off and the tracker restarts; after
    ``growth_interval`` clean steps in a row the scale grows (if it stays finite)."""
    inf = found_inf > 0
    successful = growth_tracker + 1
    grow = torch.logical_and(torch.logical_not(inf), successful == growth_interval)
    grown = scale * growth_factor
    grown = torch.where(torch.isfinite(grown), grown, scale)
    new_scale = torch.where(inf, scale * backoff_factor, torch.where(grow, grown, scale))
    new_tracker = torch.where(torch.logical_or(inf, grow), torch.zeros_like(growth_tracker), successful)
    scale.copy_(new_scale)
    growth_tracker.copy_(new_tracker)
    return scale


DECOMPOSITIONS[aten._amp_foreach_non_finite_check_and_unscale_.default] = non_finite_check_and_unscale_
DECOMPOSITIONS[aten._amp_update_scale_.default] = update_scale_
