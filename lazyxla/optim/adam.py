"""The fused Adam/AdamW step recorded as one node, its moments of same-shaped parameters stacked.

``_fused_adam_`` and ``_fused_adamw_`` (torch's fused kernels, lazyxla's default for Adam and
AdamW: ``optimizer_fused``) update lists of parameters and their state in place. Each is
recorded as one node (``lowering.lower_fused_adam``) whose outputs are the new values.

Every tensor a program writes is an output of its own, and XLA compiles each output's kernel
as an instance of its own (its HLO passes grow with them), so a model of 32 alike layers paid
three per parameter: the parameter and its two moments. The moments are the optimizer's own:
nothing but the step reads them. So the moments of parameters of one shape and dtype (all the
layers' ``fc1.weight``) live stacked: one buffer ``[L, *shape]`` per moment and shape, each
parameter's moment a view of its row (``exp_avg[k]``, as ``opt.state`` shows it), updated by
one stacked kernel, and so are the parameters' updates: parameters that are themselves the rows
of one stack (``param_stacks``, made when the optimizer was built) are read and written as that
stack; others are stacked in the program, each new one taken back at its row's runtime offset
(int32 data, one kernel for every row). The gradients of ``scan_layers``' parameters, slices of
one stacked gradient (``lazyxla::unstack``), enter stacked as they are; separate gradients are
stacked in the program (runs of a rolled loop's rows as slices of its stacks).

The groups: the parameters that are every row of one stack, in order; then the parameters whose
gradients are all the slices of one ``lazyxla::unstack``; then the rest by shape and dtype (in
their list order). The rules, in order, per group:

| the group                                                      | its moments in the step        |
|----------------------------------------------------------------|--------------------------------|
| one parameter; or its gradients are separate tensors, it is no  | as they are, one by one        |
| stack of parameters and it has fewer than ``MIN_ROWS`` members  |                                |
| (an unrolled model's few layers)                                |                                |
| its moments are the rows of stacks made here, in order          | the stacks (read and written)  |
| its moments (of every list) are rows of stacks made here, or    | stacked first where needed     |
| device data, not views, no sharding, no other tensor's alias    | (read back, sent as one buffer:|
| (the first step's zeros: ``optimizer_state``)                   | ``MomentsStacked``)            |
| anything else (pending IR, a view, an alias)                    | one by one                     |

Values are those of PyTorch's kernel, element for element (the same arithmetic in the same
order). No stack is made where ``optimizer_state.host_rewrites_allowed`` says no (SPMD: each
moment keeps its parameter's layout; several processes; a step or a torch.compile region being
captured: their bindings are the tensors') and with ``LAZYXLA_STACK_MOMENTS=0``.

May touch: the moments it stacks (their states become views of the stack: ``stacks``), and
through the node it records, the parameters, moments and gradients the step writes. Records
through ``ops``' table (``install``).
"""
from __future__ import annotations

import torch

from .. import lowering
from ..frontend import ops
from . import stacks
from ..run import storage
from ..config import env_flag
from .state import host_rewrites_allowed
from ..regions.scan import UNSTACK_OP
from ..run.storage import scalar_value
from ..frontend.tensor import reroute

ENABLED = env_flag("LAZYXLA_STACK_MOMENTS", True)
# A group of separate gradients is stacked from this many members on: stacking them (and the
# parameters) costs copies and a few more distinct kernels, which fewer instances repay only
# then (measured: ``bench/compile_depth.py``, ``bench/models.py``' GPT-2).
MIN_ROWS = 16
aten = torch.ops.aten
_FUSED = (aten._fused_adam_.default, aten._fused_adam_.tensor_lr, aten._fused_adamw_.default,
          aten._fused_adamw_.tensor_lr)


def _groups(params, grads) -> tuple:
    """(groups, stacked gradient of each or None, the storage of each that is a stack of
    parameters or None): the parameters that are every row of one stack in order
    (``param_stacks``); the parameters whose gradients are all the slices of one
    ``lazyxla::unstack`` (``scan_layers``' layers), in slice order, with the stacked gradient;
    the others grouped by shape and dtype. Groups in their first member's order."""
    by_s, rest = {}, []
    for i, p in enumerate(params):
        r = stacks.row_of(p)
        if r is not None:
            by_s.setdefault(id(r[0]), (r[0], r[2], []))[2].append((r[1], i))
        else:
            rest.append(i)
    out = []
    for st, n, got in by_s.values():
        if [k for k, _ in got] == list(range(n)):
            out.append((tuple(i for _, i in got), None, st))
        else:
            rest += [i for _, i in got]
    by_u, left = {}, []
    for i in sorted(rest):
        v = grads[i]._state.value()
        if v[0].sig.op == UNSTACK_OP:
            by_u.setdefault(id(v[0]), (v[0], []))[1].append((v[1], i))
        else:
            left.append(i)
    rest = left
    for u, got in by_u.values():
        got.sort()
        if [k for k, _ in got] == list(range(len(u.sig.outs))) and len(got) > 1:
            out.append((tuple(i for _, i in got), u.operands[0], None))
        else:
            rest += [i for _, i in got]
    by = {}
    for i in sorted(rest):
        by.setdefault((tuple(params[i].shape), params[i].dtype), []).append(i)
    out += [(tuple(ix), None, None) for ix in by.values()]
    out.sort(key=lambda g: g[0][0])
    return tuple(g[0] for g in out), [g[1] for g in out], [g[2] for g in out]


def _moments(lists, groups, gstack, pstack, stacking):
    """Apply the rules: the groups as stepped (a group that is not stacked steps its members
    one by one), the stacked gradient of each (or None), its stack of parameters (or None), and
    per group the storages of its moment stacks, one per list (or None). Makes the stacks the
    rules allow, all of a group's lists or none."""
    aliased = None
    out_groups, out_grads, out_params, tops = [], [], [], []
    for ix, gs, ps in zip(groups, gstack, pstack):
        got = None
        if len(ix) > 1 and (gs is not None or ps is not None or len(ix) >= MIN_ROWS):
            members = [[ts[i] for i in ix] for ts in lists]
            got = [stacks.stack_of(m) for m in members]
            if None in got and stacking:
                if aliased is None:
                    aliased = stacks.aliased(lists)
                if all(st is not None or stacks.can_stack(m, aliased) for st, m in zip(got, members)):
                    got = [st if st is not None else stacks.stack(m, "MomentsStacked") for st, m in zip(got, members)]
            if None in got:
                got = None
        if got is None:  # (a stack of parameters is then read and written row by row)
            out_groups += [(i,) for i in ix]
            out_grads += [None] * len(ix)
            out_params += [None] * len(ix)
            tops += [None] * len(ix)
        else:
            out_groups.append(ix)
            out_grads.append(gs)
            out_params.append(ps)
            tops.append(got)
    return tuple(out_groups), out_grads, out_params, tops


def record(func, info, args, kwargs):
    """``_fused_adam_`` / ``_fused_adamw_`` (and their ``tensor_lr`` forms): one node for the
    whole step, each written tensor (or stack) given its new value from it."""
    a = ops.bound(info, args, kwargs)
    params, grads, ms, vs, vmaxs, steps = (list(a[k]) for k in ("self", "grads", "exp_avgs", "exp_avg_sqs",
                                                                  "max_exp_avg_sqs", "state_steps"))
    n = len(params)
    if not n:
        return None
    amsgrad, scale, inf = bool(a["amsgrad"]), a.get("grad_scale"), a.get("found_inf")
    lr = a["lr"]
    lr = scalar_value(float(lr), torch.float32) if not isinstance(lr, torch.Tensor) else lr._state.value()
    lists = [ms, vs] + ([vmaxs] if amsgrad else [])
    # a group whose parameters are the rows of one stack in its order (``param_stacks``) reads
    # and writes that stack whole; any other parameter is read and written on its own
    groups, gstack, pstacks, tops = _moments(lists, *_groups(params, grads), ENABLED and host_rewrites_allowed())
    values, written = [], []  # written: tensors, or the storages of stacks
    for ix, ps in zip(groups, pstacks):
        values += [ps.ir] if ps is not None else [params[i]._state.value() for i in ix]
        written += [ps] if ps is not None else [params[i] for i in ix]
    for ix, gs in zip(groups, gstack):
        values += [gs] if gs is not None else [grads[i]._state.value() for i in ix]
    for j, ts in enumerate(lists):
        for ix, st in zip(groups, tops):
            moment = [st[j]] if st is not None else [ts[i] for i in ix]
            values += [w.ir if st is not None else w._state.value() for w in moment]
            written += moment
    if scale is not None:
        written += grads
    values += [t._state.value() for t in steps] + [lr] + [t._state.value() for t in (scale, inf) if t is not None]
    # the rows' offsets, as data (one kernel takes every row): for the groups whose parameters
    # are separate, and for the unscaled gradients
    rows = max((len(ix) for ix, ps in zip(groups, pstacks) if len(ix) > 1 and (ps is None or scale is not None)),
               default=0)
    values += [scalar_value(k, torch.int32) for k in range(rows)]
    metas = tuple(w.meta if isinstance(w, storage.Storage) else w._state.meta for w in written)
    kw = (("n", n), ("groups", groups), ("stacked_grads", tuple(gs is not None for gs in gstack)),
          ("stacked_params", tuple(ps is not None for ps in pstacks)),
          ("beta1", float(a["beta1"])), ("beta2", float(a["beta2"])), ("weight_decay", float(a["weight_decay"])),
          ("eps", float(a["eps"])), ("amsgrad", amsgrad), ("maximize", bool(a["maximize"])),
          ("decoupled", "adamw" in info.name), ("scaled", scale is not None), ("checked", inf is not None))
    node = ops.one_node(info, lowering.lower_fused_adam, values, kw, metas)
    for i, w in enumerate(written):
        if isinstance(w, storage.Storage):
            w.set_ir((node, i))
        else:
            w._state.write((node, i))
    return None


def install() -> None:
    """Record the fused steps here (once, by ``import lazyxla``)."""
    for f in _FUSED:
        ops.SPECIAL[f] = record
        reroute(f)
