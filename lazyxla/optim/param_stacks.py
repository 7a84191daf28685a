"""A fused Adam/AdamW/SGD group's alike layers' parameters kept as the rows of one stack per role.

The fused step (``optimizer_stacks``) updates a group of same-shaped parameters (all the
layers' ``fc1.weight``) as one stacked kernel. Parameters of their own were stacked in the
program and each new one taken back out: one output and one slice kernel per parameter, every
step. XLA compiles each as a kernel and a buffer of its own; in a model whose layers roll into
a loop (``rolling``), those per-parameter outputs were most of what still grew with depth (BERT
with 32 layers: 521 of them; the same layout in plain JAX compiles in 1.69 s against 0.57 s
with the weights kept stacked: ``bench/scan_layers.py --jax``).

So when such an optimizer gets a param group (``Optimizer.add_param_group``, from its
constructor: before the first forward pass, so the first step's program is the steady one),
its parameters are grouped by role, and each role's made the rows of one buffer
(``stacks.stack``, counter ``ParamsStacked``):

| rule | |
|---|---|
| the optimizer | ``Adam``, ``AdamW`` or ``SGD`` whose group will step fused (``optimizer_fused.steps_fused``) |
| a role | the parameters of one shape and dtype whose names (``model.to(device)`` records them: ``param_moves.NAMES``) are alike but for their numbers (``layer.#.attention.query.weight``), in the group's order |
| stacked | a role of at least ``rolling.MIN_ITERATIONS`` members while layers roll (``rolling.ENABLED``): a model deep enough for its layers to become a loop. A row read outside a loop takes its index from an argument of the program (``lowering.row_args``), so a model whose layers do not roll keeps one kernel per kind of layer. Shallow models are left apart: a 4-layer BERT's or GPT-2's roles stacked measured no faster a step, a first step 0.1-0.7 s longer and 20-35 MB more at peak |
| SGD | a role of at least ``SGD_MIN_ROWS`` (8) members, rolled or not: its step is elementwise, so it updates a stack, its momentum buffers' stack and its gradients' stack (``optimizer_sgd``) as one operand each, and a replayed step passes a buffer per stack instead of three per parameter (issue 52: a replayed 32-layer MLP's program took 9 arguments (the momentum among them, as data) and gave 7 outputs instead of 132 and 193) |
| each member | requires grad; lazy device data, no view, no sharding, no other tensor sharing its buffer (``stacks.can_stack``); a parameter with no recorded name (made on the device) is left alone |
| where | not where ``optimizer_state.host_rewrites_allowed`` says no (SPMD, several processes, a capture) |

Each parameter is then a view of its row: the same ``Parameter`` object, its values unchanged.
A rolled loop reads a role's rows, all of one stack in order, as that stack (no copy), the step
(``optimizer_stacks``) reads and writes each stack whole, and the loop's stacked gradients
enter it as they are. Anything that makes a parameter something else (``.data =``, ``set_``)
takes it out: its group's step reads its members one by one. ``LAZYXLA_STACK_PARAMS=0`` turns
it off.

May touch: the parameters of such groups (they become views of their stack), through ``stacks``.
"""
from __future__ import annotations

import re

import torch

from . import fused as optimizer_fused, adam as optimizer_stacks
from ..frontend import param_moves
from ..rolling import settings as rolling
from . import stacks
from ..config import env_flag
from .state import host_rewrites_allowed

ENABLED = env_flag("LAZYXLA_STACK_PARAMS", True)
# SGD's roles are stacked from this many members on, rolled or not: its step is elementwise, so
# a stack costs it nothing, and a replayed step passes one buffer per stack instead of a
# parameter, a momentum buffer and a gradient per member (issue 52: a replayed 8-layer MLP's
# step measured in ``bench/hostcost.py``)
SGD_MIN_ROWS = 8


def role(name: str) -> str:
    """A parameter's name with its numbers as ``#``: alike layers' parameters share it."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.)", "#", name)


def min_members(opt) -> int | None:
    """The fewest alike parameters stacked for this optimizer's groups (None: none are): SGD's
    ``SGD_MIN_ROWS``; Adam's and AdamW's ``rolling.MIN_ITERATIONS`` while layers roll."""
    if type(opt) is torch.optim.SGD:
        return SGD_MIN_ROWS
    return max(rolling.MIN_ITERATIONS, 2) if rolling.ENABLED else None


def _group_added(opt, group) -> None:
    if not (ENABLED and optimizer_stacks.ENABLED) or not optimizer_fused.steps_fused(opt, group):
        return
    least = min_members(opt)
    if least is None:
        return
    if not host_rewrites_allowed():
        return
    by = {}
    for p in group["params"]:
        name = param_moves.NAMES.get(p)
        if p.requires_grad and name is not None:  # (a frozen one is not in the step's lists)
            by.setdefault((tuple(p.shape), p.dtype, role(name)), []).append(p)
    aliased = None
    for members in by.values():
        if len(members) < least:
            continue
        if aliased is None:
            aliased = stacks.aliased([group["params"]])
        if stacks.can_stack(members, aliased):
            stacks.stack(members, "ParamsStacked")


def install() -> None:
    """Stack the parameters of each new param group (once, by ``import lazyxla``)."""
    if _group_added not in param_moves.GROUP_ADDED:
        param_moves.GROUP_ADDED.append(_group_added)
