"""A captured step's binding, and its replay: where each parameter's buffer comes from at a
replay, where each output goes, and the run.

For each parameter of the captured program (``step_capture`` makes the binding), its buffer at
a replay is

- a tensor that existed before the capture (weights, optimizer state, static inputs, the
  step's arguments): its storage's buffer at that replay, held by weak reference, so a freed
  or rebound tensor is an error (``StaleBinding``), never a stale buffer;
- the RNG seed: that replay's seed (R8), so every replay draws new numbers;
- a ``ReplayedStep``'s CPU tensor arguments: that call's upload of them;
- anything else is *frozen* (``FrozenValue``): the buffer it had in the capture (a Python
  number made device data, such as a float ``lr``; a tensor uploaded inside the step; a 0-d
  CPU tensor).

and for each output of the program, the storage that takes the new buffer. ``Binding.replay``
binds, runs the program through ``execution.run`` with the capture's donations, gives each
output storage its buffer and ends the step as a sync does (``executor.end_step``). Its Python
cost grows with the number of inputs and outputs, never with the number of ops. Checked at
every replay, each in O(1) unless it moved: nothing was recorded since the last step
(``storage.PENDING_BORN``; otherwise that is synced first, as its own program: ``settle``), no
tensor took another storage or layout (``storage.REBOUND``; otherwise every bound tensor is
checked), and what Python holds and the program cannot see is unchanged: the ``training`` flag
of every module the step called and the settings of every optimizer it stepped.

May touch: storages (new buffers after a replay), the RNG seed, the step closures' queue, its
metrics (``GraphReplay``). Holds the process's capture in progress (``ACTIVE_CAPTURE``, set
by ``step_capture``): a replay inside it is refused.
"""
from __future__ import annotations

import weakref
from itertools import repeat
from operator import is_ as _is

import numpy as np

from ..engine import closures, executor
from .. import metrics
from ..ir import rng
from ..run import storage
from ..debug.explain import explain
from ..errors import LazyXlaError
from ..run.execution import Completion, ExecutionError, Placeholder, resolve, run
from ..ir.node import data_sig
from ..ir.user_line import fmt_where
from ..run.storage import SCALAR_LEAVES, TensorState
from ..frontend.tensor import LazyTensor
from ..xla.client import copy_array, spmd

_weakref = weakref.ref
_COUNTERS = metrics.COUNTERS
ACTIVE_CAPTURE = None  # the capture in progress: one per process at a time, as CUDA's (``step_capture``)
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


def awaiting(message):
    """A buffer that is not there: reading it, or running a program on it, raises ``message``."""
    return Placeholder(Completion(ExecutionError(message)), None)


def settle():
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


def mark_settled():
    """Nothing is pending now (a capture gave every storage its value back)."""
    global _CLEAN_AT
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


class Binding:
    """Where each parameter's buffer comes from at a replay and where each output goes (see
    the module docstring); ``replay()`` runs it."""

    def __init__(self, cap, graph, storages, prog, step_closures):
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
        if ACTIVE_CAPTURE is not None:
            raise LazyXlaError(f"{self.what}: a replay inside a capture ({ACTIVE_CAPTURE.what}) is not possible")
        settle()
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
        was synced by ``settle``."""
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
