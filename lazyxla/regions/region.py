"""Captured regions: a torch.compile graph traced once, then recorded as one IR node per call.

The torch.compile backends (``backends``) hand each FX graph to a ``Region``. The first call
with a given signature (the inputs' shapes, dtypes and strides, and any non-tensor inputs) runs
the graph on the lazy device, as ordinary lazy tracing, and captures the IR it recorded between
the inputs' values and the outputs' values. Every captured node is copied with the inputs
replaced by numbered placeholders, so the copy's hashes depend on the operations alone, and
the region's hash is folded from them there, once (R13: "computed once, ahead of time").

Each call (the first one too) then records a single ``lazyxla::region`` node: its operands are
the inputs' current values, the constants the graph used (device data: hashed by shape and
dtype, bound as parameters) and, when the graph draws random numbers, the RNG seed value
(``rng.current``; the seed it leaves is handed back, so every call draws new numbers, R8). Its
lowering evaluates the copied nodes inside whatever program the step becomes: compiled regions
and lazily recorded ops of one step sync as one program, found in the cache by the graph
hash like any other. Inputs the graph wrote in place get their new values from the node.

Not captured, but traced op by op at every call (eager's numbers; the program is cut where
values are read): a graph whose trace needed values on the host (an op without a lowering ran
on the CPU, or a value was read); one with a 0-dim CPU tensor among its inputs (Adam's step
count: its ops run on the CPU while tracing and would be frozen into a capture); one returning
a tensor off the lazy device; a ``lazyxla_eval`` graph whose outputs alias its inputs or each
other (AOTAutograd's graphs regenerate such aliases themselves) or that is called with inputs
that require grad (autograd must see the ops).

May touch: the RNG chain (to thread the seed through a region), lazy tensors' states, the
tracing metrics.
"""
from __future__ import annotations

import torch

from .. import events, metrics
from ..ir import rng
from ..frontend.device import DEVICE
from ..errors import LazyXlaError
from ..hashing import fold
from ..ir.node import Node, OpSig, Slot
from ..ir.user_line import fmt_where
from ..ir.node import post_order
from ..ir.user_line import user_frame, user_site
from ..lowering import build_program
from ..run.storage import fresh
from ..frontend.tensor import LazyTensor, _tensor

REGION_OP = "lazyxla::region"
CAPTURING = 0  # > 0 while a region's graph runs to be captured (what it records becomes the region)
_COUNTERS = metrics.COUNTERS


def _input_sig(k, meta):
    """A placeholder for a region's input ``k``: hashes its position and meta only."""
    return OpSig("lazyxla::region_input", None, None, ((k,), ()), (meta,))


class RegionKey:
    """The region's hash inside the ``lazyxla::region`` signature (hashed as its bytes)."""

    __slots__ = ("hash", "name")

    def __init__(self, h, name):
        self.hash = h
        self.name = name

    def __lazyxla_encode__(self):
        return b"R" + self.hash

    def __repr__(self):
        return f"{self.name}#{self.hash.hex()[:8]}"


def _lower_region(sig, key, *vals):
    return sig.func(*vals)  # the captured nodes as one JAX function (``build_program``)


class Capture:
    """What one signature of a region records per call (``lazy``: traced every call instead)."""

    __slots__ = ("sig", "consts", "random", "outs", "mutated", "lazy", "why", "container", "n_ops")

    def __init__(self, lazy=False, why=""):
        self.lazy = lazy
        self.why = why
        self.sig = None
        self.consts = ()
        self.random = False
        self.outs = ()      # per graph output: a meta (a lazy tensor), or ("const", value)
        self.mutated = ()   # input positions the graph writes, in output order after the outs
        self.container = tuple  # the graph returns a tuple, a list, or (None) one value
        self.n_ops = 0          # captured op nodes


_CPU_SCALAR = ("cpu scalar",)


def _host_marks():
    """Counters that move when values reach the host: programs run, ops run on the CPU."""
    c = _COUNTERS
    return c.get("ExecuteComputation", 0), sum(v for k, v in c.items() if k.startswith("aten::"))


class Region:
    """One FX graph compiled by a lazyxla backend; called with the graph's inputs."""

    def __init__(self, gm, name: str, keeps_aliases: bool, why: str = "first trace"):
        self.gm = gm
        self.name = name
        self.keeps_aliases = keeps_aliases  # lazyxla_eval: outputs may alias inputs (no AOTAutograd)
        self.why = why  # what made Dynamo hand this graph over (its guard failures, on a recompile)
        self.captures: dict = {}

    def __call__(self, *args):
        key = []
        states = []
        for i, a in enumerate(args):
            if type(a) is LazyTensor:
                s = a._state
                states.append(s)
                key.append(s.meta)
            elif isinstance(a, torch.Tensor) and a.device.type == "cpu" and a.dim() == 0:
                key.append(_CPU_SCALAR)  # its value is read on the host each call: see _capture
            elif isinstance(a, torch.Tensor):
                raise LazyXlaError(
                    f"{self.name}: input {i} is on {a.device} but this function was compiled for {DEVICE} "
                    f"(shape {list(a.shape)}, {a.dtype}) at {fmt_where(user_frame(2))}; move the model and its "
                    f"inputs with .to(lazyxla.device())")
            else:
                key.append(("v", type(a), a))
        key = tuple(key)
        c = self.captures.get(key)
        if c is None:
            if self.keeps_aliases and torch.is_grad_enabled() and any(
                    isinstance(a, torch.Tensor) and a.requires_grad for a in args):
                # autograd has to see the ops: no capture for this call (nor cached)
                return self.gm(*args)
            c, traced = self._capture(args, states, key)
            self._published(c, key)
            self.captures[key] = c
            if c.lazy:
                return traced  # this call's outputs, from the tracing run
            return self._replay(c, states, traced)  # the inputs' values from before the trace
        if c.lazy:
            metrics.counter_inc("DynamoRegionTracedLazily")
            return self.gm(*args)
        return self._replay(c, states)

    def _published(self, c, key):
        if not events.AFTER_CAPTURE:
            return
        if self.captures:
            old = next(reversed(self.captures))
            why = (f"new inputs for the same graph: {_signature_text(key)} (was {_signature_text(old)})")
        else:
            why = self.why
        if c.lazy:
            why += f"; traced again at every call: {c.why}"
        h = c.sig.template[0][0].hash.hex() if c.sig is not None else ""
        where = user_frame(3)
        for fn in events.AFTER_CAPTURE:
            fn(self.name, why, h, where, c.n_ops)

    # -- capture ---------------------------------------------------------------------------
    def _capture(self, args, states, key):
        global CAPTURING
        before = [s.value() for s in states]
        seed0 = rng.current()
        marks = _host_marks()
        CAPTURING += 1
        try:
            outs = self.gm(*args)
        finally:
            CAPTURING -= 1
        seed1 = rng.current()
        if _CPU_SCALAR in key:
            return Capture(lazy=True, why="a CPU scalar tensor input (such as an optimizer's step count) is "
                                          "computed with on the host"), outs
        if _host_marks() != marks:
            return Capture(lazy=True, why="values were read on the host while tracing it"), outs
        flat = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        lazy_outs = [o for o in flat if type(o) is LazyTensor]
        if len(lazy_outs) != sum(isinstance(o, torch.Tensor) for o in flat):
            return Capture(lazy=True, why="it returns a tensor that is not on the lazy device"), outs
        if self.keeps_aliases and _aliases(lazy_outs, states):
            return Capture(lazy=True, why="its outputs alias its inputs or each other"), outs
        c = Capture()
        after = [s.value() for s in states]
        c.mutated = tuple(k for k, (b, a) in enumerate(zip(before, after)) if a is not b)
        c.random = seed1 is not seed0
        inputs = before + ([seed0] if c.random else [])
        metas = [s.meta for s in states] + ([seed0[0].sig.outs[seed0[1]]] if c.random else [])
        roots = [o._state.value() for o in lazy_outs] + [after[k] for k in c.mutated] + ([seed1] if c.random else [])
        out_metas = [o._state.meta for o in lazy_outs] + [states[k].meta for k in c.mutated] + \
            ([seed1[0].sig.outs[seed1[1]]] if c.random else [])
        placeholders, post, croots, consts = _copy(inputs, metas, roots)
        c.consts = tuple(consts)
        c.n_ops = len(post)
        c.outs = tuple(o._state.meta if type(o) is LazyTensor else ("const", o) for o in flat)
        h = fold(b"region", *[r.vh[i] for r, i in croots])
        template = ((RegionKey(h, self.name),) + tuple(Slot(i) for i in range(len(placeholders))), ())
        program = build_program(placeholders + post, croots, placeholders)
        c.sig = OpSig(REGION_OP, program, _lower_region, template, out_metas)
        rng.set_current(seed0)  # the call itself draws the numbers, through the region node
        metrics.counter_inc("DynamoExtractCompiledGraph")
        c.container = type(outs) if isinstance(outs, (tuple, list)) else None
        return c, before

    # -- replay ----------------------------------------------------------------------------
    def _replay(self, c, states, vals=None):
        """Record this call as one ``lazyxla::region`` node; per input one operand, per output a
        new tensor (or the input it wrote gets the node's value). Called at every call of a
        compiled graph: written for speed (no Python call per output besides its tensor)."""
        vals = [s.storage.ir if s.chain is None else s.value() for s in states] if vals is None else list(vals)
        if c.random:
            vals.append(rng.current())
        vals.extend(c.consts)
        node = Node(c.sig, tuple(vals), user_site(3))
        out = []
        j = 0
        for m in c.outs:
            if type(m) is tuple:
                out.append(m[1])
            else:
                out.append(_tensor(fresh((node, j), m)))
                j += 1
        for k in c.mutated:
            states[k].write((node, j))
            j += 1
        if c.random:
            rng.set_current((node, j))
        _COUNTERS["DynamoRegionCall"] = _COUNTERS.get("DynamoRegionCall", 0) + 1
        if c.container is None:
            return out[0]
        return out if c.container is list else tuple(out)


def _signature_text(key) -> str:
    return "(" + ", ".join(repr(k) if not (type(k) is tuple and k[:1] == ("v",)) else repr(k[2]) for k in key) + ")"


def _aliases(outs, states) -> bool:
    seen = {id(s.storage) for s in states}
    for o in outs:
        st = id(o._state.storage)
        if st in seen:
            return True
        seen.add(st)
    return False


def _copy(inputs, metas, roots):
    """The nodes between ``inputs`` and ``roots`` (IR values), copied with each input (and each
    device-data constant met on the way) replaced by a numbered placeholder. Returns the
    placeholders, the copied op nodes (operands first), the copied roots and the constants'
    values (in placeholder order, after the inputs)."""
    index = {}
    placeholders = []
    for k, ((n, i), m) in enumerate(zip(inputs, metas)):
        index.setdefault((id(n), i), k)
        placeholders.append(Node(_input_sig(k, m), ()))
    consts = []

    def operand(o, i):
        k = index.get((id(o), i))
        if k is None and o.data is not None:  # a constant: bound as a parameter of the program
            k = index[(id(o), i)] = len(placeholders)
            placeholders.append(Node(_input_sig(k, o.sig.outs[i]), ()))
            consts.append((o, i))
        if k is not None:
            return (placeholders[k], 0)
        return (copies[id(o)], i)

    copies, post = {}, []
    for n in post_order(roots, skip={id(n) for n, _ in inputs}):
        if n.data is None:
            cn = copies[id(n)] = Node(n.sig, tuple(operand(o, i) for o, i in n.operands), n.where)
            post.append(cn)
    return placeholders, post, [operand(r, i) for r, i in roots], consts
