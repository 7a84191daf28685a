"""Parameters replaced on the way to or from the device, and the optimizers that still hold them.

``model.to(lazyxla.device())`` cannot change a CPU Parameter into a lazy one in place (as it
can for CUDA): ``nn.Module._apply`` puts a new Parameter in the module, as it does for torch_xla.
An optimizer made before the move still holds the old CPU tensors; they never get a gradient,
so its ``step()`` would do nothing and the loop would learn nothing, silently. Here:

- ``record(module, before)`` (from ``kernels``' ``Module._apply`` wrapper) remembers, per old
  Parameter still alive, the new one that took its place and its name in the module, and at
  once makes every live optimizer that holds one follow (``install`` keeps a weak set of the
  optimizers, from ``Optimizer.add_param_group``), so a clip over the optimizer's parameters
  before its first step already sees the new ones;
- while any old Parameter is remembered, a global optimizer step pre-hook ``follow``\\ s: every
  old Parameter an optimizer holds is replaced, in its param groups and its state, by the
  Parameter that took its place (through a chain of moves: ``.to(dev)`` then ``.cpu()``), as
  accelerate does for torch_xla; ``distributed.gradients`` (``xm._fetch_gradients``, reached
  before ``step()`` by accelerate's gradient all-reduce) follows first too;
- when the Parameter that took its place is gone (its module was deleted or moved again and
  dropped), the step raises ``LazyXlaError`` naming the parameters and where they live.

The hook is registered only while an old Parameter lives: a script that makes its optimizer
after the move pays nothing per step.
May touch: the optimizers' ``param_groups`` and ``state`` entries of moved parameters, and
``torch.optim.Optimizer.add_param_group`` (wrapped once, by ``install``; it runs ``GROUP_ADDED``
after each group is added).
"""
from __future__ import annotations

import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.weak import WeakIdKeyDictionary

from .. import metrics
from ..errors import LazyXlaError

# id(old parameter) -> (weakref to it, weakref to the parameter that replaced it, its name)
MOVED: dict = {}
OPTIMIZERS: "weakref.WeakSet" = weakref.WeakSet()  # every optimizer made since install()
NAMES = WeakIdKeyDictionary()  # a Parameter moved to the lazy device -> its name
GROUP_ADDED: list = []  # f(optimizer, its new param group), run after each group is added (``param_stacks``)
_add_param_group = torch.optim.Optimizer.add_param_group


def _adding(self, param_group):
    OPTIMIZERS.add(self)
    _add_param_group(self, param_group)
    for f in GROUP_ADDED:
        f(self, self.param_groups[-1])


def install() -> None:
    """Know the optimizers (once per process): ``Optimizer.add_param_group`` notes its optimizer."""
    if torch.optim.Optimizer.add_param_group is not _adding:
        torch.optim.Optimizer.add_param_group = _adding
_hook = [None]  # the global optimizer step pre-hook's handle while MOVED holds anything


def _forget(key):
    def drop(_ref):
        MOVED.pop(key, None)
        if not MOVED and _hook[0] is not None:
            _hook[0].remove()
            _hook[0] = None
    return drop


def places(module, recurse=True) -> dict:
    """id(parameter) -> (parameter, [(submodule, attribute, qualified name), ...]) before a move."""
    out: dict = {}
    named = module.named_modules() if recurse else (("", module),)
    for prefix, m in named:
        for name, p in m._parameters.items():
            if p is not None:
                out.setdefault(id(p), (p, []))[1].append((m, name, f"{prefix}.{name}" if prefix else name))
    return out


def record(before: dict) -> None:
    """Remember every Parameter of ``before`` (``places()`` taken before the move) that a new
    Parameter of another kind (lazy for CPU, or back) replaced."""
    from .tensor import LazyTensor
    for old, held in before.values():
        m, attr, qual = held[0]
        new = m._parameters.get(attr)
        if new is None or new is old or (type(new) is LazyTensor) == (type(old) is LazyTensor):
            continue
        key = id(old)
        try:
            ref = weakref.ref(old, _forget(key))
        except TypeError:
            continue
        MOVED[key] = (ref, weakref.ref(new), qual)
        if type(new) is LazyTensor:
            NAMES[new] = qual
    if MOVED and _hook[0] is None:
        _hook[0] = register_optimizer_step_pre_hook(_pre_step)
    for opt in list(OPTIMIZERS):
        try:
            follow(opt)
        except LazyXlaError:  # said again, and raised, at its step
            pass


def _pre_step(optimizer, args, kwargs):
    follow(optimizer)


def _target(p):
    """The live Parameter that took ``p``'s place (following chains of moves), None when it
    is gone, or ``p`` itself when it was never moved."""
    seen = 0
    while True:
        entry = MOVED.get(id(p))
        if entry is None or entry[0]() is not p:
            return p
        new = entry[1]()
        if new is None:
            return None
        p = new
        seen += 1
        if seen > 64:  # a cycle cannot arise (each move makes a new object); a guard all the same
            return p


def follow(optimizer) -> None:
    """Swap the moved Parameters ``optimizer`` holds for the ones that replaced them (groups and
    state); raise naming them when those are gone."""
    if not MOVED:
        return
    lost = []
    for group in optimizer.param_groups:
        params = group["params"]
        if all(id(p) not in MOVED for p in params):
            continue
        swapped = []
        for p in params:
            if id(p) not in MOVED:
                swapped.append(p)
                continue
            q = _target(p)
            if q is None:
                lost.append((MOVED[id(p)][2], p))
                swapped.append(p)
                continue
            if q is not p:
                _move_state(optimizer, p, q)
                metrics.counter_inc("MovedParameterFollowed")
            swapped.append(q)
        if not lost:
            if len({id(q) for q in swapped}) != len(swapped):
                names = [MOVED[id(p)][2] for p in params if id(p) in MOVED]
                raise LazyXlaError(
                    f"{type(optimizer).__name__}.step(): this optimizer holds both the parameters "
                    f"{', '.join(names[:6])}{' ...' if len(names) > 6 else ''} as they were before "
                    f"Module.to() and the ones that replaced them; make the optimizer from "
                    f"model.parameters() once, after moving the model")
            group["params"] = swapped
    if lost:
        names = ", ".join(f"{n} ({p.device})" for n, p in lost[:6]) + (" ..." if len(lost) > 6 else "")
        raise LazyXlaError(
            f"{type(optimizer).__name__}.step(): this optimizer holds {len(lost)} parameter(s) that "
            f"Module.to() replaced by new ones which no longer exist: {names}. It would update tensors "
            f"no model uses and the loop would learn nothing; make the optimizer from "
            f"model.parameters() after moving the model")


def _move_state(optimizer, old, new) -> None:
    state = optimizer.state.pop(old, None)
    if not state:
        return
    moved = {}
    for k, v in state.items():
        # torch's load_state_dict keeps a non-capturable 'step' where it is; the rest follows
        # the parameter (device; dtype for floating values)
        if isinstance(v, torch.Tensor) and k != "step":
            v = v.to(device=new.device, dtype=new.dtype if v.is_floating_point() else v.dtype)
        moved[k] = v
    optimizer.state[new] = moved
