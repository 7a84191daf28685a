"""Capture a step once, replay its program: ``Graph``, ``graph``, ``make_graphed_callables``
(PyTorch CUDA Graphs' names) and ``ReplayedStep`` (``lazyxla.compile(fn, replay=True)``).

A capture records a step as usual, then stops where a sync would run: the executor's own
``plan_pending`` collects the pending IR, folds the graph hash, plans the donations and finds or
compiles the program (the LRU and persistent caches, the same program a sync would run), and
nothing runs. Every tensor gets back the value it had before the capture; a tensor made inside
it holds no value until the first replay (reading it says so). What the capture keeps is a
``Binding``: for each parameter of the program, where its buffer comes from at a replay,

- a tensor that existed before the capture (weights, optimizer state, static inputs, the
  step's arguments): its storage's buffer at that replay, held by weak reference, so a freed
  or rebound tensor is an error, never a stale buffer;
- the RNG seed: that replay's seed (R8), so every replay draws new numbers;
- a ``ReplayedStep``'s CPU tensor arguments: that call's upload of them;
- anything else is *frozen*: the buffer it had in the capture (a Python number made device
  data, such as a float ``lr``; a tensor uploaded inside the step; a 0-d CPU tensor).
  ``Graph.frozen()`` lists each with its op and user line.

and for each output of the program, the storage that takes the new buffer. A replay binds,
runs the program through ``execution.run`` with the capture's donations, gives each output
storage its buffer and ends the step as a sync does (``executor.end_step``). Its Python cost
grows with the number of inputs and outputs, never with the number of ops.

Refused inside a capture, at the user's line, before anything runs: a value read or a sync
(the executor's capture guard), the step of an optimizer whose step count lives on the CPU
(``capturable=False``), and an optimizer step that makes its state (its first step, which
every replay would repeat). Checked at every replay, each in O(1) unless it moved: nothing was
recorded since the last step (``storage.PENDING_BORN``; otherwise that is synced first, as its
own program), no tensor took another storage or layout (``storage.REBOUND``; otherwise every
bound tensor is checked), and what Python holds and the program cannot see is unchanged: the
``training`` flag of every module the step called and the settings of every optimizer it
stepped. ``ReplayedStep`` also traces its first replays (and every ``check_every``-th) again
and compares the graph key and the frozen values with the capture's.

May touch: storages and states (restored after a capture, new buffers after a replay), the RNG
seed, the executor's capture guard, eager mode's switch while capturing, the step closures'
queue, PyTorch's global optimizer and module hooks while capturing, its metrics
(``GraphCapture``, ``GraphReplay``, ``GraphReplayCheck``, ``GraphRecapture``,
``GraphReplayLazyCall``).
"""
from __future__ import annotations

import threading
import warnings
import weakref
from itertools import repeat
from operator import is_ as _is, itemgetter

import numpy as np
import torch
import torch.nn as nn
import torch.optim.optimizer as _optim
from torch.utils import _pytree as pytree

from . import closures, eager, events, executor, metrics, optimizer_counts, rng, storage
from .debug.explain import explain
from .errors import LazyXlaError
from .execution import Completion, ExecutionError, Placeholder, resolve, run
from .ir import TensorMeta, data_sig, fmt_where, user_frame
from .storage import SCALAR_LEAVES, TensorState, live_states
from .tensor import LazyTensor
from .xla import copy_array, spmd

_weakref = weakref.ref
_COUNTERS = metrics.COUNTERS
_ACTIVE = None     # the capture in progress: one per process at a time, as CUDA's
_CLEAN_AT = -1     # storage.PENDING_BORN when the arena was last seen with nothing pending


class StaleBinding(LazyXlaError):
    """A replay cannot bind what its capture bound (a tensor freed or rebound, a module's
    ``training`` flag or an optimizer's hyperparameter changed); nothing ran."""


class FrozenValue:
    """A value that entered a capture from Python or the host: every replay uses it as the
    capture saw it. ``kind``, ``meta`` (shape and dtype), ``op`` and ``where`` (the first op that
    used it, and its user line); ``value`` reads it (small ones are shown in ``str``)."""

    __slots__ = ("kind", "meta", "op", "where", "_data")

    def __init__(self, kind, meta, op, where, data):
        self.kind, self.meta, self.op, self.where, self._data = kind, meta, op, where, data

    @property
    def value(self):
        """The frozen value as a NumPy array (read from the device)."""
        return np.asarray(resolve(self._data))

    def __str__(self):
        shown = ""
        if self.meta.numel <= 8:
            v = self.value
            shown = f" = {v.item() if v.ndim == 0 else v.tolist()}"
        return f"{self.kind} {self.meta!r}{shown}, used by {self.op} at {fmt_where(self.where)}"

    __repr__ = __str__


def _awaiting(message):
    """A buffer that is not there: reading it, or running a program on it, raises ``message``."""
    return Placeholder(Completion(ExecutionError(message)), None)


def _settle():
    """Make sure nothing is pending before a replay binds buffers: ops recorded since the last
    step (they may read a buffer the replay donates, or be a static input's new value) are
    synced first, as their own step. O(1) when nothing was recorded since the arena was last
    seen clean."""
    global _CLEAN_AT
    if storage.PENDING_BORN == _CLEAN_AT:
        return
    storages, _ = storage.pending()
    # a storage whose value is another's device data (copy_ of device data) needs no program
    if rng.pending() or any(st.ir[0].data is None for st in storages):
        executor.sync()
    _CLEAN_AT = storage.PENDING_BORN


def _where_used(graph, leaves):
    """For each leaf (by id), the first op of the graph that uses it and its user line."""
    want, found = {id(n) for n in leaves}, {}
    for n in graph.post:
        if n.data is not None:
            continue
        for o, _ in n.operands:
            i = id(o)
            if i in want and i not in found:
                found[i] = (n.sig.op, n.where)
    return found


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


class _Capture:
    """One capture in progress: what every tensor was before it, and the hooks that watch it.
    ``args``: the flat arguments of a ``ReplayedStep`` call (their tensors are bound per call)."""

    def __init__(self, what: str, args=()):
        self.what = what
        self.args = args

    # -- begin ----------------------------------------------------------------------------
    def begin(self):
        global _ACTIVE
        if _ACTIVE is not None:
            raise LazyXlaError(f"{self.what}: another capture ({_ACTIVE.what}) is in progress; captures do not nest "
                               f"(at {fmt_where(user_frame(2))})")
        self.was_eager = eager.ON
        eager.ON = False
        try:
            _settle()  # what was pending before the capture is a step of its own (nothing: no step)
        except BaseException:
            eager.ON = self.was_eager
            raise
        self.thread = threading.get_ident()
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
        _ACTIVE = self

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
        global _ACTIVE
        for h in self.hooks:
            h.remove()
        executor.set_capture_guard(self.old_guard)
        storage.upload_hook = self.old_upload_hook
        _ACTIVE = None

    def _restore(self, pending_storages, new_value):
        """Every storage gets back its value from before the capture, every tensor its storage;
        a storage made inside the capture gets ``new_value()`` (a buffer that is not there)."""
        global _CLEAN_AT
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
        _CLEAN_AT = storage.PENDING_BORN

    def abort(self):
        """The step raised inside the capture: everything goes back as it was before it."""
        self._unhook()
        closures.take_closures()  # the failed step's closures are dropped
        closures.queue_closures(*self.queued)
        pending, _ = storage.pending()
        self._restore(pending, lambda: _awaiting(
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
            self._restore(pending, lambda: _awaiting("lazyxla: this tensor was made inside a capture whose "
                                                     "program could not be built, so it has no value"))
            raise
        if plan is None:
            warnings.warn(f"{self.what}: the captured step is empty (no tensor was computed); replaying it runs "
                          f"nothing", stacklevel=3)
            self._restore([], None)
            return Binding(self, None, (), None, step_closures)
        storages, graph, prog = plan
        b = Binding(self, graph, storages, prog, step_closures)
        self._restore(storages, lambda: _awaiting(
            f"lazyxla: this tensor is an output of the captured graph {prog.key.hex()}, which has not been "
            f"replayed yet (a capture records and compiles, and runs nothing)"))
        return b


class Binding:
    """Where each parameter's buffer comes from at a replay and where each output goes (see
    the module docstring); ``replay()`` runs it."""

    def __init__(self, cap: _Capture, graph, storages, prog, step_closures):
        self.prog = prog
        self.what = cap.what
        self.closures = step_closures
        self.modules = list(cap.modules.values())
        self.optimizers = [s for _, s in cap.optimizers.values()]
        self.rebound_seen = storage.REBOUND
        self.frozen = []
        self.key_hex = self.trace = None
        self.template = []                    # frozen buffers in place; the rest is filled per replay
        self.t_pos, self.t_refs = [], []      # tensors bound by their storage
        self.a_pos, self.a_idx = [], []       # a ReplayedStep's lazy tensor arguments, by flat index
        self.c_pos, self.c_idx = [], []       # its CPU tensor arguments (uploaded per call)
        self.seed_pos = None
        self.o_refs = []
        if prog is None:
            return
        self.key_hex = prog.key.hex()
        self.trace = prog.trace
        params = graph.params
        self.template = [None] * len(params)
        frozen_leaves = []
        seed = cap.seed[0]
        before = cap.before
        # after the capture's first sync every storage's value is a leaf of its own
        by_leaf = {id(b[1][0]): b[0] for b in before.values() if b[2] is not None}
        kinds = []
        for p, leaf in enumerate(params):
            if leaf is seed:
                self.seed_pos = p
                kinds.append("the RNG seed")
                continue
            u = cap.uploaded.get(id(leaf))
            if u is not None and u[0] is leaf:
                self.c_pos.append(p)
                self.c_idx.append(u[1])
                kinds.append(f"CPU argument {u[1]}")
                continue
            st = by_leaf.get(id(leaf))
            if st is not None:  # a tensor's value at the capture's start
                i = cap.arg_of.get(id(st))
                if i is not None:
                    self.a_pos.append(p)
                    self.a_idx.append(i)
                    kinds.append(f"argument {i}")
                else:
                    self.t_pos.append(p)
                    self.t_refs.append(_weakref(st))
                    kinds.append(f"a tensor {st.meta!r}")
                continue
            self.template[p] = leaf.data
            ref = leaf.owner
            frozen_leaves.append((p, leaf, ref() if ref is not None else None))
            kinds.append("frozen")
        self.kinds = kinds
        bound = {id(r()) for r in self.t_refs}
        # (state ref, storage ref) of every tensor of a bound storage: a rebound one is refused
        self.watched = [(_weakref(s), _weakref(st)) for s, st, _, _ in cap.states if id(st) in bound]
        self.layouts = [(r, r().sharding) for r in self.t_refs]  # SPMD: the annotations it was compiled for
        self._describe_frozen(graph, frozen_leaves)
        # outputs: the storages a sync would have given buffers, in the program's order
        self.o_refs = [_weakref(st) for st in storages]
        self.o_args = [(k, cap.arg_of[id(st)]) for k, st in enumerate(storages) if id(st) in cap.arg_of]
        arg_out = {k for k, _ in self.o_args}
        # (output index, storage ref, its leaf signature: None under SPMD, where the output's
        # layout is read from the buffer each time, the leaf's owner: the storage, or None for an
        # output whose buffer a new tensor takes too at every call, ``share_outputs``)
        self.o_plain = [(k, r, None if spmd() else data_sig(st.meta), r) for k, (r, st) in
                        enumerate(zip(self.o_refs, storages)) if k not in arg_out]
        self.o_meta = [st.meta for st in storages]
        self.out_index = {id(st): k for k, st in enumerate(storages)}
        self.donated = donated = set(prog.donated)
        # a donated argument that holds a buffer another tensor holds too is copied first
        self.d_args = [(self.a_pos.index(p), p) for p in sorted(donated) if p in self.a_pos]
        self.n_out = len(storages)

    def _describe_frozen(self, graph, frozen_leaves):
        scalars = {id(v[0]): k[1] for k, v in SCALAR_LEAVES.items()}
        used = _where_used(graph, [leaf for _, leaf, _ in frozen_leaves])
        for p, leaf, st in frozen_leaves:
            op, where = used.get(id(leaf), ("(an output)", None))
            if id(leaf) in scalars:
                kind = f"the Python number {scalars[id(leaf)]!r}"
            elif leaf.owner is not None:
                kind = "a tensor uploaded or made inside the capture"
            else:
                kind = "a constant (device data of no tensor)"
            self.frozen.append((p, FrozenValue(kind, leaf.sig.outs[0], op, where, leaf.data)))

    # -- the checks of every replay ----------------------------------------------------------
    def _check_watches(self):
        for ref, training in self.modules:
            m = ref()
            if m is not None and m.training != training:
                raise StaleBinding(
                    f"{self.what}: {type(m).__name__}.training is {m.training}, but the step was captured with "
                    f"{training} (model.train()/model.eval() after the capture); capture the step again for it")
        for settings in self.optimizers:
            why = settings.changed()
            if why is not None:
                raise StaleBinding(f"{self.what}: {why}; the captured program holds the old value. Use a tensor "
                                   f"(lr=torch.tensor(..., device=lazyxla.device()), changed with fill_) or capture "
                                   f"again")

    def _check_bindings(self):
        for ref, st in self.watched:
            s = ref()
            if s is not None and s.storage is not st():
                raise StaleBinding(f"{self.what}: a tensor the step reads ({s.meta!r}) was rebound to another "
                                   f"storage after the capture (p.data = ..., set_()); capture the step again")
        for ref, layout in self.layouts:
            st = ref()
            if st is not None and st.sharding is not layout:
                raise StaleBinding(f"{self.what}: a tensor the step reads ({st.meta!r}) was laid out anew after the "
                                   f"capture (mark_sharding / clear_sharding); its program was compiled for the old "
                                   f"layout: capture the step again")
        self.rebound_seen = storage.REBOUND

    def _freed(self):
        for p, r in zip(self.t_pos, self.t_refs):
            if r() is None:
                return StaleBinding(f"{self.what}: input {p} of the captured graph {self.key_hex} was freed after "
                                    f"the capture; the replay has no buffer for it. Keep the tensors a captured step "
                                    f"reads alive (or capture again)")
        return None

    # -- replay --------------------------------------------------------------------------------
    def replay(self, arg_states=(), cpu_arrays=()):
        """Run the program on the buffers bound now; give every output storage its new buffer;
        end the step. ``arg_states``/``cpu_arrays``: a ReplayedStep call's arguments (the
        states of its lazy tensors and the uploads of its CPU tensors, by flat index).
        Returns the output placeholders (in the program's order), or None for an empty step.
        Raises ``StaleBinding`` before anything runs if it cannot bind what the capture bound."""
        if _ACTIVE is not None:
            raise LazyXlaError(f"{self.what}: a replay inside a capture ({_ACTIVE.what}) is not possible")
        _settle()
        if storage.REBOUND != self.rebound_seen:
            self._check_bindings()
        if self.modules or self.optimizers:
            self._check_watches()
        prog = self.prog
        if prog is None:
            self._end_step()
            return None
        args = self.template[:]
        try:
            datas = [r().data for r in self.t_refs]
        except AttributeError:
            raise self._freed() from None
        for p, d in zip(self.t_pos, datas):
            args[p] = d
        for p, i in zip(self.a_pos, self.a_idx):
            args[p] = arg_states[i].storage.data
        for p, i in zip(self.c_pos, self.c_idx):
            args[p] = cpu_arrays[i]
        if self.seed_pos is not None:
            args[self.seed_pos] = rng.current()[0].data
        if any(map(_is, args, repeat(None))):
            self._bind_copies(args, arg_states)
        for j, p in self.d_args:
            if arg_states[self.a_idx[j]].storage.ir[0].owner is None:
                args[p] = copy_array(resolve(args[p]))
        outs = run(prog.executable, args, self.n_out, self.key_hex, timed=False, checks=prog.checks)
        if outs and outs[0].completion.error is not None:
            outs[0].get()  # raises now, naming the graph; no storage was given the failed buffers
        for k, r, sig, owner in self.o_plain:
            st = r()
            if st is not None:
                if sig is None:
                    st.set_data(outs[k], shared=owner is None)
                else:
                    st.take_output(outs[k], sig, owner)
        for k, i in self.o_args:
            arg_states[i].storage.set_data(outs[k])
        _COUNTERS["GraphReplay"] = _COUNTERS.get("GraphReplay", 0) + 1
        self._end_step()
        return outs

    def _bind_copies(self, args, arg_states):
        """A bound storage whose value is another's device data (``copy_`` of device data)
        binds that buffer (a copy of it where the program donates it); anything else pending
        was synced by ``_settle``."""
        sts = [r() for r in self.t_refs] + [arg_states[i].storage for i in self.a_idx]
        for p, st in zip(self.t_pos + self.a_pos, sts):
            if args[p] is None:
                leaf = st.ir[0]
                if leaf.data is None:
                    raise LazyXlaError(f"{self.what}: input {p} of graph {self.key_hex} is pending IR at the replay")
                args[p] = copy_array(resolve(leaf.data)) if p in self.donated else leaf.data

    def share_outputs(self, ks):
        """Outputs ``ks`` also go to a new tensor at every replay (``fresh_output``): the static
        storage's leaf has no owner either, so neither storage ever donates the shared buffer."""
        ks = set(ks)
        self.o_plain = [(k, r, sig, None if k in ks else owner) for k, r, sig, owner in self.o_plain]

    def fresh_output(self, outs, k, chain, meta):
        """A new tensor holding output ``k`` of a replay (``outs``), viewed by ``chain``: a storage
        of its own, sharing the buffer with the static storage (``share_outputs``)."""
        st = storage.Storage(None, self.o_meta[k])
        st.set_data(outs[k], shared=True)
        return LazyTensor(TensorState(st, meta, chain))

    def _end_step(self):
        if self.closures[0] or self.closures[1]:
            closures.queue_closures(*self.closures)
        executor.end_step()

    def same_as(self, other: "Binding"):
        """None if ``other`` (a capture of the same step later) has this one's key and frozen
        values; otherwise what differs, in words (merge site, IR node, user line)."""
        if self.key_hex != other.key_hex:
            if self.trace is None or other.trace is None:
                return "the step computed nothing at one capture and something at the other"
            sites, text, where = explain(other.trace, self.trace)
            at = f" (at {fmt_where(where)})" if where else ""
            return f"the graph changed: {', '.join(sites)}: {text}{at}"
        for p, (a, b) in enumerate(zip(self.kinds, other.kinds)):
            if a != b:
                return f"input {p} of the program is {b} now, {a} at the capture"
        for (p, a), (q, b) in zip(self.frozen, other.frozen):
            if a._data is b._data:
                continue
            va, vb = a.value, b.value
            if va.shape != vb.shape or not np.array_equal(va, vb, equal_nan=True):
                return (f"a frozen value changed: {b.kind}, used by {b.op} at {fmt_where(b.where)}, is "
                        f"{_short(vb)} now and was {_short(va)} at the capture")
        return None


def _short(v):
    return repr(v.item()) if v.ndim == 0 else f"{v.dtype}{list(v.shape)}"


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
        cap = _Capture("lazyxla.graph")
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
        """The values frozen into the capture (``FrozenValue``: kind, shape and dtype, the op that
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
        cap = _Capture(self.what, flat)
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
