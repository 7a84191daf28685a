"""Which kernel an optimizer steps with: Adam, AdamW and SGD left to their default step fused.

PyTorch picks an optimizer's implementation when the user leaves ``foreach`` and ``fused``
unset: on a device that registers foreach kernels, as lazyxla's does, the ``foreach`` one. On
a lazy device every op is traced, so the foreach step of Adam or AdamW records about twelve ops
per parameter each step (BERT with 4 layers of 256: ~800 ops, tens of ms of the step's host
time), and XLA gets them as separate updates. Its fused step, ``_fused_adam(w)_``, is one node
for all parameters (``lowering.optim``), computing what PyTorch's CPU kernel computes. SGD's
foreach step records two or three ops per parameter; its fused step, ``_fused_sgd_``, is one
node too (``optimizer_sgd``), and only a fused step reads and writes a stack of parameters,
momentum buffers and gradients whole (``param_stacks``): a replayed SGD step then passes a
stack, not a buffer per parameter (issue 52).

So at the first step of an ``Adam``, ``AdamW`` or ``SGD`` (not under SPMD: ``_by_default``) whose
parameters are all on the lazy device,
every group that left ``foreach`` and ``fused`` unset, and asks nothing the fused kernel lacks
(``differentiable``, a tensor ``lr``, complex parameters), is set ``fused=True`` (counter
``OptimizerFusedByDefault``), before any state exists, so the state is made for that kernel. A
choice the user made is kept.
``LAZYXLA_FUSED_OPTIMIZER=0`` leaves PyTorch's default.

May touch: the ``fused`` entry of such an optimizer's param groups, at its first step.
"""
from __future__ import annotations

import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .. import metrics
from ..config import env_flag
from ..frontend.tensor import LazyTensor
from ..xla.client import spmd

ENABLED = env_flag("LAZYXLA_FUSED_OPTIMIZER", True)
KINDS = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)  # the optimizers with a fused kernel lazyxla lowers
_seen: "weakref.WeakSet" = weakref.WeakSet()


def _by_default(opt) -> bool:
    """Whether this optimizer's kind steps fused unless told otherwise: ``KINDS``, but SGD not
    under SPMD, where its fused program's sharded momentum buffers came back from the persistent
    cache with other argument shardings than the compiled program's (a second process failed to
    load it: test_spmd's persistent cache test); its foreach step is kept there."""
    return type(opt) in KINDS and not (type(opt) is torch.optim.SGD and spmd())


def _pre(opt, args, kwargs):
    if opt in _seen:
        return
    _seen.add(opt)
    if not ENABLED or not _by_default(opt) or opt.state:
        return
    params = [p for g in opt.param_groups for p in g["params"]]
    if not params or not all(type(p) is LazyTensor for p in params):
        return
    for g in opt.param_groups:
        if fusable(g):
            g["fused"] = True
            metrics.counter_inc("OptimizerFusedByDefault")


def fusable(group) -> bool:
    """Whether a param group left ``foreach`` and ``fused`` unset and asks nothing the fused
    kernel lacks (the rule above)."""
    return (group.get("fused") is None and group.get("foreach") is None and not group.get("differentiable")
            and not isinstance(group.get("lr"), torch.Tensor)
            and all(p.is_floating_point() and not p.is_complex() for p in group["params"]))


def steps_fused(opt, group) -> bool:
    """Whether this group of an optimizer on the lazy device will step with the fused kernel:
    set by the user, or (as far as it can be known before the first step) by this module."""
    if type(opt) not in KINDS or not all(type(p) is LazyTensor for p in group["params"]):
        return False
    return group.get("fused") is True or (ENABLED and _by_default(opt) and fusable(group))


def install() -> None:
    """Register the step pre-hook (once, by ``import lazyxla``)."""
    register_optimizer_step_pre_hook(_pre)
