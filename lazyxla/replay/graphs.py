"""Capture a step once, replay its program: ``Graph``, ``graph``, ``make_graphed_callables``
(PyTorch CUDA Graphs' names) and ``ReplayedStep`` (``lazyxla.compile(fn, replay=True)``).

The flow: ``step_capture`` records a step and plans its program without running it; the
``binding.Binding`` it leaves runs that program at each replay on the buffers bound then.
This module is the API on those two. ``ReplayedStep`` also traces its first replays (and every
``check_every``-th) again and compares the graph key and the frozen values with the
capture's, and captures again for a new argument signature.

May touch: what ``step_capture`` and ``binding`` touch, through them; its metrics
(``GraphReplayCheck``, ``GraphRecapture``, ``GraphReplayLazyCall``).
"""
from __future__ import annotations

import weakref

import torch
import torch.nn as nn
from torch.utils import _pytree as pytree

from .. import events
from ..engine import executor
from .. import metrics
from ..run import storage
from .binding import StaleBinding
from ..errors import LazyXlaError
from ..ir.node import TensorMeta
from ..ir.user_line import fmt_where, user_frame
from ..run.storage import TensorState
from .capture import Capture
from ..frontend.tensor import LazyTensor

_weakref = weakref.ref
_COUNTERS = metrics.COUNTERS


# =========================================================================================
# PyTorch CUDA Graphs' names.
class Graph:
    """A captured step (``torch.cuda.CUDAGraph``'s counterpart): ``with lazyxla.graph(g): ...``
    records and compiles the step and runs nothing; ``g.replay()`` runs it on the tensors'
    current buffers, updating the static outputs, gradients, parameters and optimizer state in
    place."""

    def __init__(self):
        self._binding = None
        self._capture = None

    def capture_begin(self):
        if self._binding is not None or self._capture is not None:
            raise LazyXlaError("This lazyxla.Graph already holds a captured step. To capture a new one, make a "
                               "new lazyxla.Graph() (or call reset() first)")
        cap = Capture("lazyxla.graph")
        cap.begin()
        self._capture = cap

    def capture_end(self):
        cap, self._capture = self._capture, None
        if cap is None:
            raise LazyXlaError("lazyxla.Graph.capture_end() without capture_begin()")
        self._binding = cap.end()
        metrics.counter_inc("GraphCapture")

    def _capture_abort(self):
        cap, self._capture = self._capture, None
        if cap is not None:
            cap.abort()

    def replay(self):
        """Run the captured step once more."""
        b = self._binding
        if b is None:
            raise LazyXlaError("lazyxla.Graph.replay(): nothing was captured (use `with lazyxla.graph(g): ...`)")
        b.replay()

    def reset(self):
        """Forget the captured step."""
        self._binding = None

    def frozen(self) -> list:
        """The values frozen into the capture (``binding.FrozenValue``: kind, shape and dtype, the op that
        used it and its user line); every replay uses them as the capture saw them."""
        return [] if self._binding is None else [f for _, f in self._binding.frozen]

    @property
    def graph_hash(self):
        """The captured program's graph hash (hex), computed once at the capture; None if empty."""
        return None if self._binding is None else self._binding.key_hex

    def __repr__(self):
        if self._binding is None:
            return "<lazyxla.Graph (nothing captured)>"
        return f"<lazyxla.Graph {self._binding.key_hex}: {len(self._binding.frozen)} frozen values>"


class graph:  # noqa: N801 - torch.cuda.graph's name
    """``with lazyxla.graph(g): <one step>``: capture the step into ``g`` (a ``lazyxla.Graph``).
    If the body raises, every tensor is as it was before and ``g`` holds nothing."""

    def __init__(self, g: Graph):
        if not isinstance(g, Graph):
            raise TypeError(f"lazyxla.graph expects a lazyxla.Graph, got {type(g).__name__}")
        self.g = g

    def __enter__(self):
        self.g.capture_begin()
        return self.g

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.g._capture_abort()
            return False
        self.g.capture_end()
        return False


# =========================================================================================
# lazyxla.compile(fn, replay=True)
_FLAT = {LazyTensor, torch.Tensor, int, float, bool, str, type(None)}


def _arg_key(a, i, storages):
    """What a call's argument contributes to the key of its capture."""
    if type(a) is LazyTensor:
        s = a._state
        first = storages.setdefault(id(s.storage), i)  # two arguments on one storage: another capture
        return (s.meta, s.storage.meta, s.chain, first)
    if isinstance(a, torch.Tensor):
        if a.device.type != "cpu":
            raise LazyXlaError(f"lazyxla.compile(replay=True): argument {i} is on {a.device}; pass tensors on "
                               f"lazyxla.device() or the CPU (at {fmt_where(user_frame(3))})")
        return ("cpu", a.shape, a.dtype, a.stride())
    try:
        hash(a)
    except TypeError:
        return ("object", type(a), id(a))
    return ("value", type(a), a)


def _describe_key(key) -> str:
    parts = []
    for k in key[1]:
        if isinstance(k[0], TensorMeta):
            parts.append(repr(k[0]))
        elif k[0] == "cpu":
            parts.append(f"cpu {list(k[1])} {k[2]}")
        else:
            parts.append(repr(k[2]))
    return "(" + ", ".join(parts) + ")"


class _Signature:
    """One argument signature of a ReplayedStep: its calls, its capture and checks, and how a
    call builds its result (``ReplayedStep._adopt``)."""

    __slots__ = ("calls", "binding", "replays", "outputs", "spec")

    def __init__(self):
        self.calls = 0
        self.binding = None
        self.replays = 0
        self.outputs = None  # per returned leaf: ("out", k, chain, meta) | ("arg", i, chain, meta) | ("same", obj)
        self.spec = None


class ReplayedStep:
    """``lazyxla.compile(fn, replay=True)``: each argument signature's first ``warmup`` calls run
    lazily (``lazy``: the step as ``lazyxla.compile(fn)`` runs it; a step whose first call makes
    state, as an optimizer's does, needs one), the next one captures the step and replays it,
    later ones replay it, binding that call's arguments. The first ``checks``
    replays, and every ``check_every``-th after them, trace the step again and compare its key
    and frozen values with the capture's (a difference raises before anything runs). A stale
    binding (a freed or rebound tensor, a changed ``training`` flag or hyperparameter) or a new
    argument signature captures again, at most ``max_captures`` times; every capture after the
    first is recorded in ``lazyxla.debug.recompile_log()`` with its reason."""

    def __init__(self, fn, lazy, name, checks=2, check_every=0, max_captures=8, warmup=1):
        self.fn = fn
        self.warmup = int(warmup)
        self.lazy = lazy
        self.name = name or getattr(fn, "__name__", "step")
        self.checks = int(checks)
        self.check_every = int(check_every or 0)
        self.max_captures = int(max_captures)
        self.captures = 0
        self._sigs: dict = {}
        self._last_key = None
        self.__wrapped__ = fn
        self.__name__ = self.name
        self.__doc__ = getattr(fn, "__doc__", None)

    @property
    def what(self):
        return f"lazyxla.compile({self.name}, replay=True)"

    def __call__(self, *args, **kwargs):
        if kwargs or not all(type(a) in _FLAT for a in args):
            flat, spec = pytree.tree_flatten((args, kwargs))
        else:  # the common call: tensors and numbers, no containers
            flat, spec = args, len(args)
        storages = {}
        key = (spec, tuple(_arg_key(a, i, storages) for i, a in enumerate(flat)))
        sig = self._sigs.get(key)
        if sig is None:
            sig = self._sigs[key] = _Signature()
        if sig.binding is None:
            sig.calls += 1
            if sig.calls <= self.warmup or self.captures >= self.max_captures:
                if sig.calls > self.warmup:
                    _COUNTERS["GraphReplayLazyCall"] = _COUNTERS.get("GraphReplayLazyCall", 0) + 1
                return self.lazy(*args, **kwargs)
            why = "first capture" if self.captures == 0 else self._new_signature_reason(key)
            return self._capture(sig, key, flat, args, kwargs, why)
        sig.replays += 1
        n = sig.replays
        if n <= self.checks or (self.check_every and (n - self.checks) % self.check_every == 0):
            return self._checked(sig, key, flat, args, kwargs)
        try:
            return self._replay(sig, flat)
        except StaleBinding as e:  # nothing ran
            sig.binding = None
            if self.captures >= self.max_captures:
                raise
            _COUNTERS["GraphRecapture"] = _COUNTERS.get("GraphRecapture", 0) + 1
            return self._capture(sig, key, flat, args, kwargs, str(e))

    def _new_signature_reason(self, key):
        old = self._last_key
        if old is None or old == key:
            return "captured again"
        return f"new arguments {_describe_key(key)} (was {_describe_key(old)})"

    def _trace(self, flat, args, kwargs):
        cap = Capture(self.what, flat)
        cap.begin()
        try:
            out = self.fn(*args, **kwargs)
        except BaseException:
            cap.abort()
            raise
        return cap, out

    def _capture(self, sig, key, flat, args, kwargs, why):
        cap, out = self._trace(flat, args, kwargs)
        binding = cap.end()
        metrics.counter_inc("GraphCapture")
        self.captures += 1
        self._last_key = key
        sig.replays = 0
        for hook in events.AFTER_GRAPH_CAPTURE:
            hook(self.name, why, binding.key_hex or "", user_frame(3))
        return self._adopt(sig, binding, cap, out, flat)

    def _checked(self, sig, key, flat, args, kwargs):
        """Trace the call again and compare it with the capture; replay the new capture (the
        same program) if nothing differs, raise if something does."""
        _COUNTERS["GraphReplayCheck"] = _COUNTERS.get("GraphReplayCheck", 0) + 1
        cap, out = self._trace(flat, args, kwargs)
        binding = cap.end()
        diff = sig.binding.same_as(binding)
        if diff is not None:
            sig.replays -= 1  # nothing was replayed
            raise LazyXlaError(
                f"{self.what}: replay {sig.replays} would not compute what this call computes: {diff}. Nothing was "
                f"run. The step's Python depends on values the capture froze; run it without replay "
                f"(lazyxla.compile({self.name})), or keep those values in device tensors")
        return self._adopt(sig, binding, cap, out, flat)

    def _adopt(self, sig, binding, cap, out, flat):
        """Make ``binding`` (captured from this call, which returned ``out``) the signature's,
        with the recipe each call builds its result by, and replay it for this call: per
        returned leaf, a new tensor from an output the step made (``out``), the call's own
        argument (``arg``), or the very object the capture returned (``same``); the result's tree
        spec is None for one new tensor."""
        leaves, spec = pytree.tree_flatten(out)
        recipe, made = [], []
        for leaf in leaves:
            r = ("same", leaf)
            if type(leaf) is LazyTensor:
                s = leaf._state
                st = s.storage
                b = cap.before.get(id(st))
                k = binding.out_index.get(id(st)) if binding.prog is not None else None
                if id(st) in cap.arg_of:
                    r = ("arg", cap.arg_of[id(st)], s.chain, s.meta)
                elif k is not None and (b is None or b[0] is not st):  # made by the step
                    r = ("out", k, s.chain, s.meta)
                    made.append(k)
            recipe.append(r)
        if made:
            binding.share_outputs(made)
        sig.binding, sig.outputs = binding, recipe
        sig.spec = None if spec.is_leaf() and recipe[0][0] == "out" else spec
        return self._replay(sig, flat)

    def _replay(self, sig, flat):
        b = sig.binding
        arg_states = [a._state if type(a) is LazyTensor else None for a in flat]
        cpu = {i: storage.upload(flat[i]).storage.data for i in set(b.c_idx)}
        outs = b.replay(arg_states, cpu)
        if sig.spec is None:  # one tensor returned, made by the step
            return _result(sig.outputs[0], outs, flat, b)
        return pytree.tree_unflatten([_result(r, outs, flat, b) for r in sig.outputs], sig.spec)


def _result(r, outs, flat, binding):
    """One leaf of a call's result, by its recipe (``ReplayedStep._adopt``)."""
    if r[0] == "out":
        return binding.fresh_output(outs, *r[1:])
    if r[0] == "arg":
        a = flat[r[1]]
        return a if r[2] is a._state.chain else LazyTensor(TensorState(a._state.storage, r[3], r[2]))
    return r[1]


# =========================================================================================
# torch.cuda.make_graphed_callables
def make_graphed_callables(callables, sample_args, num_warmup_iters: int = 3, allow_unused_input: bool = False):
    """``torch.cuda.make_graphed_callables`` for the lazy device: each callable (an
    ``nn.Module`` or a function; a tuple of them gives a tuple back) is warmed up, then its
    forward and its backward are captured as two graphs, and calls replay them through an
    autograd function. A module comes back as itself with ``forward`` replaced (its own forward
    runs when its ``training`` flag is not the one it was captured with); a function as a new
    callable. Unlike CUDA's, each call's outputs and gradients are tensors of their own (never
    overwritten by the next call), and arguments of another shape or dtype than the samples'
    are refused."""
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    made = [_graphed(fn, tuple(args), num_warmup_iters, allow_unused_input)
            for fn, args in zip(callables, sample_args)]
    return made[0] if single else tuple(made)


def _graphed(fn, args, warmup, allow_unused):
    what = f"lazyxla.make_graphed_callables({getattr(fn, '__name__', type(fn).__name__)})"
    for i, a in enumerate(args):
        if type(a) is not LazyTensor:
            raise TypeError(f"{what}: sample argument {i} is not a tensor on lazyxla.device() "
                            f"(sample_args must contain only lazy tensors)")
    module = isinstance(fn, nn.Module)
    if module and (fn._forward_hooks or fn._forward_pre_hooks or fn._backward_hooks):
        raise LazyXlaError(f"{what}: modules must have no hooks when they are graphed (their Python would not "
                           f"run at a replay)")
    params = tuple(fn.parameters()) if module else ()
    inputs = args + params
    needs = [t.requires_grad for t in inputs]

    def grads_of(outs, grad_outs, retain=False):
        return torch.autograd.grad([o for o in outs if o.requires_grad], [t for t in inputs if t.requires_grad],
                                   grad_outputs=[g for g in grad_outs if g is not None], only_inputs=True,
                                   allow_unused=allow_unused, retain_graph=retain)

    for _ in range(warmup):
        outs = pytree.tree_leaves(fn(*args))
        if any(o.requires_grad for o in outs):
            grads_of(outs, [torch.empty_like(o) if o.requires_grad else None for o in outs])
        del outs
        executor.sync()
    fwd = Graph()
    with graph(fwd):
        out = fn(*args)
    static_outs, out_spec = pytree.tree_flatten(out)
    if not all(type(o) is LazyTensor for o in static_outs):
        raise LazyXlaError(f"{what}: the callable must return tensors on lazyxla.device()")
    # new buffers, not *_like ops of the outputs: those hold no value until the first replay
    static_grad_outs = [torch.zeros(o.shape, dtype=o.dtype, device=o.device) if o.requires_grad else None
                        for o in static_outs]
    bwd = Graph()
    with graph(bwd):
        # the saved tensors stay: the backward graph reads their buffers at every replay
        grads = grads_of(static_outs, static_grad_outs, retain=True) if any(needs) else ()
    it = iter(grads)
    static_grads = [next(it) if n else None for n in needs]
    fwd_out = _shared_outputs(fwd._binding, static_outs)
    bwd_out = _shared_outputs(bwd._binding, [g for g in static_grads if g is not None])
    n_args = len(args)

    class Graphed(torch.autograd.Function):
        # the static outputs hold the captured autograd graph, whose saved tensors the backward
        # graph reads: they live as long as the graphed callable
        keep = (static_outs, static_grads)

        @staticmethod
        def forward(ctx, *call_inputs):
            for i, (s, a) in enumerate(zip(args, call_inputs[:n_args])):
                if type(a) is not LazyTensor or a._state.meta is not s._state.meta:
                    raise LazyXlaError(f"{what}: argument {i} is {_describe(a)}, but the callable was graphed for "
                                       f"{s._state.meta!r} on lazyxla.device()")
                if a._state.storage is not s._state.storage:
                    s.detach().copy_(a.detach())
            outs = fwd._binding.replay()
            return tuple(fwd._binding.fresh_output(outs, *r) for r in fwd_out)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, *grad_outs):
            for s, g in zip(static_grad_outs, grad_outs):
                if s is not None:
                    if g is None:
                        s.detach().zero_()
                    elif g._state.storage is not s._state.storage:
                        s.detach().copy_(g.detach())
            outs = bwd._binding.replay() if bwd._binding.prog is not None else ()
            it = iter(bwd_out)
            return tuple(bwd._binding.fresh_output(outs, *next(it)) if g is not None else None for g in static_grads)

    def functionalized(*user_args):
        if len(user_args) != n_args:
            raise TypeError(f"{what}: called with {len(user_args)} arguments, graphed with {n_args}")
        return pytree.tree_unflatten(list(Graphed.apply(*(tuple(user_args) + params))), out_spec)

    if not module:
        return functionalized
    training, own_forward = fn.training, fn.forward

    def forward(*user_args):
        return functionalized(*user_args) if fn.training == training else own_forward(*user_args)

    fn.forward = forward
    return fn


def _shared_outputs(binding, tensors):
    """For each tensor (a static output of the binding): (its output index, its view chain and
    meta), for ``Binding.fresh_output``; those outputs go to a new tensor at every replay."""
    ks = [binding.out_index[id(t._state.storage)] for t in tensors]
    binding.share_outputs(ks)
    return [(k, t._state.chain, t._state.meta) for k, t in zip(ks, tensors)]


def _describe(a):
    if isinstance(a, torch.Tensor):
        return f"{a.dtype}{list(a.shape)} on {a.device}"
    return type(a).__name__

