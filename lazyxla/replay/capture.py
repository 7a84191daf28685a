"""Capture a step: record it as usual, stop where a sync would run, give every tensor its value back.

The executor's own ``plan_pending`` collects the pending IR, folds the graph hash, plans the
donations and finds or compiles the program (the LRU and persistent caches: the same program
a sync would run), and nothing runs. Every tensor gets back the value it had before the
capture; a tensor made inside it holds no value until the first replay (reading it says so).
What the capture keeps is a ``binding.Binding``. While it records, it watches what the
program cannot see: the modules the step called (their ``training`` flags) and the optimizers
it stepped (their settings, ``_Settings``).

Refused inside a capture, at the user's line, before anything runs: a value read or a sync
(the executor's capture guard), the step of an optimizer whose step count lives on the CPU
(``capturable=False``), an optimizer step that makes its state (its first step, which every
replay would repeat), and a capture inside another.

May touch: storages and states (restored after the capture), the RNG seed, the executor's
capture guard, eager mode's switch, PyTorch's global optimizer and module hooks and the
upload hook while capturing, ``binding.ACTIVE_CAPTURE``, its metrics (``GraphCapture``).
"""
from __future__ import annotations

import threading
import warnings
import weakref
from operator import itemgetter

import torch
import torch.nn as nn
import torch.optim.optimizer as _optim

from . import binding
from ..engine import closures, eager, executor
from .. import metrics
from ..optim import counts as optimizer_counts
from ..ir import rng
from ..run import storage
from .binding import Binding, awaiting
from ..errors import LazyXlaError
from ..ir.user_line import fmt_where, user_frame
from ..run.storage import live_states
from ..frontend.tensor import LazyTensor

_weakref = weakref.ref
_COUNTERS = metrics.COUNTERS


def _is_number(v) -> bool:
    return isinstance(v, (bool, int, float)) or (type(v) is tuple and all(isinstance(x, (bool, int, float)) for x in v))


class _Settings:
    """What an optimizer's step reads from Python besides its tensors, as a capture saw it: per
    param group, its numbers (and tuples of numbers: ``betas``) and which tensor each
    tensor-valued setting (a tensor ``lr``) is. ``changed()`` says what differs now."""

    __slots__ = ("ref", "cls", "groups")

    def __init__(self, opt):
        self.ref = _weakref(opt)
        self.cls = type(opt).__name__
        self.groups = []
        for g in opt.param_groups:
            keys = tuple(k for k, v in g.items() if k != "params" and _is_number(v))
            tensors = tuple((k, v) for k, v in g.items() if isinstance(v, torch.Tensor))
            self.groups.append((keys, itemgetter(*keys) if keys else None, tuple(g[k] for k in keys), tensors))

    def changed(self):
        """None while the optimizer's settings are the captured ones (or it is gone), else what changed."""
        opt = self.ref()
        if opt is None:
            return None
        pgs = opt.param_groups
        if len(pgs) != len(self.groups):
            return f"{self.cls} has {len(pgs)} param groups now, {len(self.groups)} at the capture"
        for i, (g, (keys, get, values, tensors)) in enumerate(zip(pgs, self.groups)):
            try:
                now = get(g) if get is not None else None
            except KeyError:
                now = None
            if get is not None and (now if len(keys) > 1 else (now,)) != values:
                for k, v in zip(keys, values):
                    if g.get(k) != v:
                        return f"{self.cls}.param_groups[{i}][{k!r}] is {g.get(k)!r} now, {v!r} at the capture"
            for k, t in tensors:
                if g.get(k) is not t:
                    return f"{self.cls}.param_groups[{i}][{k!r}] is another tensor now than at the capture"
        return None


def _state_keys(opt):
    """Which state an optimizer holds, per parameter (the keys of ``opt.state[p]``)."""
    return {id(p): tuple(s) for p, s in opt.state.items()}


class Capture:
    """One capture in progress: what every tensor was before it, and the hooks that watch it.
    ``args``: the flat arguments of a ``ReplayedStep`` call (their tensors are bound per call)."""

    def __init__(self, what: str, args=()):
        self.what = what
        self.args = args

    # -- begin ----------------------------------------------------------------------------
    def begin(self):
        if binding.ACTIVE_CAPTURE is not None:
            raise LazyXlaError(f"{self.what}: another capture ({binding.ACTIVE_CAPTURE.what}) is in progress; captures do not nest "
                               f"(at {fmt_where(user_frame(2))})")
        self.was_eager = eager.ON
        eager.ON = False
        try:
            binding.settle()  # what was pending before the capture is a step of its own (nothing: no step)
        except BaseException:
            eager.ON = self.was_eager
            raise
        self.thread = threading.get_ident()
        storage.mark_step_start()  # what is made from here on is the captured step's own
        optimizer_counts.before_capture()
        self.states = [(s, s.storage, s.chain, s.meta) for s in live_states()]
        self.before = {}
        for _, st, _, _ in self.states:
            if id(st) not in self.before:
                self.before[id(st)] = (st, st.ir, st.data)
        self.seed = rng.current()
        self.arg_of = {}        # id(storage) -> flat argument index (a lazy tensor argument)
        self.cpu_args = {}      # flat index -> CPU tensor argument
        for i, a in enumerate(self.args):
            if type(a) is LazyTensor:
                self.arg_of.setdefault(id(a._state.storage), i)
            elif isinstance(a, torch.Tensor):
                self.cpu_args[i] = a
        self.uploaded = {}      # id(leaf) -> (leaf, flat index of the CPU argument it uploads)
        self.modules = {}       # id(module) -> (weakref, training)
        self.optimizers = {}    # id(optimizer) -> (the optimizer, its _Settings)
        self.old_guard = executor.set_capture_guard(self._refuse)
        self.old_upload_hook, storage.upload_hook = storage.upload_hook, self._on_upload
        self.hooks = [_optim.register_optimizer_step_pre_hook(self._on_optimizer_step),
                      _optim.register_optimizer_step_post_hook(self._after_optimizer_step),
                      nn.modules.module.register_module_forward_pre_hook(self._on_module_call)]
        self.opt_state = {}     # id(optimizer) -> its state's keys per parameter, before its step
        self.queued = closures.take_closures()  # none, after the sync; kept apart from the step's own
        binding.ACTIVE_CAPTURE = self

    # -- what the hooks see -----------------------------------------------------------------
    def _mine(self) -> bool:
        return threading.get_ident() == self.thread

    def _refuse(self, what):
        if not self._mine():
            return
        where = user_frame(2)
        what = what or executor.describe_read()
        raise LazyXlaError(
            f"{self.what}: {what} at {fmt_where(where)} inside a capture: a captured step runs on the device "
            f"only, and a value read there would be frozen into every replay. Nothing was run. Read values "
            f"after the replay (or in lazyxla.add_step_closure(fn, args), which runs after each replay)")

    def _on_upload(self, host, state):
        if not self._mine():
            return
        for i, a in self.cpu_args.items():
            if host is a or (host.dtype == a.dtype and host.shape == a.shape and host.stride() == a.stride()
                             and host.data_ptr() == a.data_ptr()):
                leaf = state.storage.ir[0]  # the upload may die before the capture ends; its leaf is in the graph
                self.uploaded[id(leaf)] = (leaf, i)
                return

    def _on_optimizer_step(self, opt, args, kwargs):
        if not self._mine():
            return
        if any(g.get("capturable") is False for g in opt.param_groups):
            raise LazyXlaError(
                f"Attempting lazyxla graph capture of step() for an instance of {type(opt).__name__} but "
                f"param_groups' capturable is False (at {fmt_where(user_frame(2))}): its step count lives on "
                f"the CPU and would be frozen into every replay. Build it with capturable=True")
        if id(opt) not in self.optimizers:
            self.optimizers[id(opt)] = (opt, _Settings(opt))
        self.opt_state[id(opt)] = _state_keys(opt)

    def _after_optimizer_step(self, opt, args, kwargs):
        if not self._mine() or _state_keys(opt) == self.opt_state.get(id(opt)):
            return
        raise LazyXlaError(
            f"{self.what}: {type(opt).__name__}.step() made its state inside the capture (its first step, at "
            f"{fmt_where(user_frame(2))}): every replay would run that first step again (a fresh momentum, a step "
            f"count of 1). Run one step before the capture, as CUDA Graphs' warm-up does "
            f"(lazyxla.compile(fn, replay=True) does it for you)")

    def _on_module_call(self, module, args):
        if self._mine():
            self.modules.setdefault(id(module), (_weakref(module), module.training))

    # -- end --------------------------------------------------------------------------------
    def _unhook(self):
        for h in self.hooks:
            h.remove()
        executor.set_capture_guard(self.old_guard)
        storage.upload_hook = self.old_upload_hook
        binding.ACTIVE_CAPTURE = None

    def _restore(self, pending_storages, new_value):
        """Every storage gets back its value from before the capture, every tensor its storage;
        a storage made inside the capture gets ``new_value()`` (a buffer that is not there)."""
        before = self.before
        for st in pending_storages:
            b = before.get(id(st))
            if b is not None and b[0] is st:
                st.restore(b[1], b[2])
            else:
                st.set_data(new_value())
        for s, st, chain, meta in self.states:
            if s.storage is not st or s.chain is not chain or s.meta is not meta:
                s.rebind(st, chain, meta)
        rng.set_current(self.seed)
        eager.ON = self.was_eager
        binding.mark_settled()

    def abort(self):
        """The step raised inside the capture: everything goes back as it was before it."""
        self._unhook()
        closures.take_closures()  # the failed step's closures are dropped
        closures.queue_closures(*self.queued)
        pending, _ = storage.pending()
        self._restore(pending, lambda: awaiting(
            f"lazyxla: this tensor was made inside a {self.what} capture that failed, so it has no value"))

    def end(self) -> "Binding":
        """The captured step's program, found or compiled (nothing runs), and its binding."""
        self._unhook()
        step_closures = closures.take_closures()
        closures.queue_closures(*self.queued)
        try:
            plan = executor.plan_pending("capture")
        except BaseException:
            pending, _ = storage.pending()
            self._restore(pending, lambda: awaiting("lazyxla: this tensor was made inside a capture whose "
                                                     "program could not be built, so it has no value"))
            raise
        if plan is None:
            warnings.warn(f"{self.what}: the captured step is empty (no tensor was computed); replaying it runs "
                          f"nothing", stacklevel=3)
            self._restore([], None)
            return Binding(self, None, (), None, step_closures)
        storages, graph, prog = plan
        b = Binding(self, graph, storages, prog, step_closures)
        self._restore(storages, lambda: awaiting(
            f"lazyxla: this tensor is an output of the captured graph {prog.key.hex()}, which has not been "
            f"replayed yet (a capture records and compiles, and runs nothing)"))
        return b


