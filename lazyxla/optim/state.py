"""The optimizer's first step: its new state enters as data, so the first step is the steady one.

A torch optimizer makes its state in its first step (Adam's ``exp_avg = zeros_like(p)``), so
that step's program holds the state's factories where every later step's holds the state as
parameters, and its new tensors come after the step's own in the arena (the roots' order, R3):
two programs before the steady state, each as long to compile (torch_xla the same). Here, during
a step of an optimizer some of whose parameters on the lazy device have no state yet:

- ``zeros_like``, ``ones_like``, ``full_like`` (and ``zeros``/``ones``/``full`` aimed at the
  device) make device data at once (the values uploaded, ``OptimizerStateAsData``), not IR;
- after the step, the tensors of the new state take their place in the arena at the start of
  the step (``storage.move_to_step_start``), where they will be in every later step;
- state the optimizer made when it was built (Adagrad's ``sum``), still one of those factories
  pending at its first step, takes its value as uploaded data then;
- SGD with momentum gets zero momentum buffers before its first step, which then runs the
  steady step's code: ``buf * momentum + grad * (1 - dampening)``, which without dampening is
  the gradient the first step would clone. With dampening, that add into the new buffers takes
  its factor as data holding 1 (``signature.AsData``) where later steps' holds ``1 - dampening``:
  the same graph, and the first step's buffer is the gradient, as PyTorch's. A group stepped
  with the ``fused`` kernel gets the same zero buffers; its kernel's record
  (``optimizer_sgd``) asks ``undamped_first`` which of them take the factor 1.

The first step's graph is then the steady step's graph: one program, found in the cache by the
second step. Values are unchanged (the same zeros, the same updates). Off where
``host_rewrites_allowed`` says no (SPMD, several processes, a step or a torch.compile region
being captured), and with ``LAZYXLA_OPTIMIZER_STATE_AS_DATA=0``.

May touch: ``ops.SPECIAL`` (during such a step only) and the arena's order (``storage``).
"""
from __future__ import annotations

import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ..regions import region as capture
from .. import events, metrics
from ..frontend import ops
from ..run import storage
from ..config import env_flag
from ..engine.host_reads import run_op
from ..frontend.signature import AsData
from ..frontend.tensor import LazyTensor, reroute
from ..xla.client import download, process_mesh, spmd

ENABLED = env_flag("LAZYXLA_OPTIMIZER_STATE_AS_DATA", True)
aten = torch.ops.aten

# The factories an optimizer makes its state with: op -> the host tensor of the same value
_HOST = {
    aten.zeros_like.default: lambda a, kw: torch.zeros(a[0].shape, dtype=kw.get("dtype") or a[0].dtype),
    aten.ones_like.default: lambda a, kw: torch.ones(a[0].shape, dtype=kw.get("dtype") or a[0].dtype),
    aten.full_like.default: lambda a, kw: torch.full(a[0].shape, a[1], dtype=kw.get("dtype") or a[0].dtype),
    aten.zeros.default: lambda a, kw: torch.zeros(a[0], dtype=kw.get("dtype") or torch.get_default_dtype()),
    aten.ones.default: lambda a, kw: torch.ones(a[0], dtype=kw.get("dtype") or torch.get_default_dtype()),
    aten.full.default: lambda a, kw: torch.full(a[0], a[1], dtype=kw.get("dtype") or torch.get_default_dtype()),
}

_settled: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # optimizer -> params counted when settled
_active = None  # (optimizer, its parameters that had no state) while a first step runs
_ADD = aten.add_.Tensor  # how SGD adds the gradient into its buffers (``_foreach_add_`` too, one by one)
_damped: dict = {}  # id of a first step's zero momentum buffer -> the steady step's 1 - dampening


def _as_data(func, info, args, kwargs):
    metrics.counter_inc("OptimizerStateAsData")
    return storage.upload(_HOST[func](args, kwargs))


def _lazy_params(opt):
    return [p for g in opt.param_groups for p in g["params"] if type(p) is LazyTensor]


def _settle_made_state(opt):
    """State the optimizer made when it was built (Adagrad's ``sum = full_like(p, v)``), still a
    pending factory at its first step, takes its value as uploaded data, as later steps see it."""
    for p in _lazy_params(opt):
        for t in opt.state.get(p, {}).values():
            if type(t) is LazyTensor:
                host = _factory_value(t._state)
                if host is not None and storage.take_host(t._state, host):
                    metrics.counter_inc("OptimizerStateAsData")


def _factory_value(state):
    """The host value of a tensor whose pending IR is one of ``_HOST``'s factories over device
    data (a shape to copy, and numbers the host sent), or None."""
    st = state.storage
    if state.chain is not None or st.data is not None or st.ir is None:
        return None
    node = st.ir[0]
    if getattr(node.sig, "func", None) not in _HOST or not all(o.is_data for o, _ in node.operands):
        return None
    metas = [o.sig.outs[i] for o, i in node.operands]
    numbers = iter(download([o.data for (o, _), m in zip(node.operands, metas) if m.shape == ()],
                            [m.dtype for m in metas if m.shape == ()]))
    vals = [next(numbers) if m.shape == () else torch.empty(m.shape, dtype=m.dtype) for m in metas]
    return run_op(node.sig, vals)[0]


def host_rewrites_allowed() -> bool:
    """Whether an optimizer step may be rewritten on the host (its new state made as data here,
    its step counts added on the host: ``optimizer_counts``, its moments stacked:
    ``optimizer_stacks``): not under SPMD or in a job of several processes (the state's layout
    and bindings are theirs), and not while a step or a torch.compile region is captured (a
    replay runs the recorded program, not this Python)."""
    return not (spmd() or process_mesh() is not None or storage.upload_hook is not None or capture.CAPTURING)


def step_made_rewrites_allowed(tensors) -> bool:
    """Whether these tensors, made by this step (its gradients), may be rewritten (made rows of
    a stack the program computes: ``stacks.stack_pending``): as ``host_rewrites_allowed``, but
    also while a step is captured, when every one of them was made inside the capture (a
    capture gives back what existed before it, so such a tensor keeps its rewrite; one made
    before it would be put back and miss the replays' values)."""
    if spmd() or process_mesh() is not None or capture.CAPTURING:
        return False
    return storage.upload_hook is None or all(storage.made_this_step(t._state) for t in tensors)


def _pre(opt, args, kwargs):
    global _active
    n = sum(len(g["params"]) for g in opt.param_groups)
    if not ENABLED or _settled.get(opt) == n:
        return
    if not host_rewrites_allowed():
        return
    if opt not in _settled:
        _settled[opt] = 0
        _settle_made_state(opt)
    fresh = [p for p in _lazy_params(opt) if p.grad is not None and p not in opt.state]
    if not fresh:
        if opt.state:  # stepped before: what has no state now has no gradient (frozen)
            _settled[opt] = n
        return
    _end()  # a step that raised left its factories patched
    _active = (opt, fresh)
    for f in _HOST:
        ops.SPECIAL[f] = _as_data
        reroute(f)
    if type(opt) is torch.optim.SGD:
        _zero_momentum(opt, set(fresh))


def _zero_momentum(opt, fresh):
    """SGD with momentum: its first step clones the gradient into the buffer, other Python than
    the steady step's ``buf * momentum + grad * (1 - dampening)``. So the buffer starts as zeros
    (device data, as above) and the first step runs the steady step's code; with dampening, its
    add into these buffers multiplies the gradient by data holding 1 (``_undamped``)."""
    for g in opt.param_groups:
        if g["momentum"] == 0:
            continue
        for p in g["params"]:
            if p in fresh:
                buf = opt.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if g["dampening"] != 0:
                    _damped[id(buf)] = 1 - g["dampening"]
    if _damped:
        ops.SPECIAL[_ADD] = _undamped
        reroute(_ADD)


def undamped_first(buf) -> bool:
    """Whether ``buf`` is a first step's zero momentum buffer whose group has dampening: its
    add of the gradient takes the factor 1, not ``1 - dampening``."""
    return id(buf) in _damped


def _undamped(func, info, args, kwargs):
    """An add into the zero momentum buffers of a first step (``_zero_momentum``), with the
    steady step's factor ``1 - dampening``: recorded with data holding 1 in its place."""
    alpha = kwargs.get("alpha")
    if alpha is not None and _damped.get(id(args[0])) == alpha:
        kwargs = dict(kwargs, alpha=AsData(1.0))
    return ops.Record(args, kwargs)


def _end():
    global _active
    if _active is not None:
        _active = None
        for f in _HOST:
            ops.SPECIAL.pop(f, None)
            reroute(f)
    if _damped:
        _damped.clear()
        ops.SPECIAL.pop(_ADD, None)
        reroute(_ADD)


def _post(opt, args, kwargs):
    if _active is None or _active[0] is not opt:
        return
    fresh = _active[1]
    _end()
    storage.move_to_step_start([t._state for p in fresh for t in opt.state.get(p, {}).values()
                                if type(t) is LazyTensor])


def install() -> None:
    """Register the optimizer step hooks (once, by ``import lazyxla``); a sync ends a first step
    that raised (``_end``)."""
    register_optimizer_step_pre_hook(_pre)
    register_optimizer_step_post_hook(_post)
    events.AFTER_STEP.append(_end)
