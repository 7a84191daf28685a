"""Dynamic dimensions: which input sizes vary, their bounds, and the padded graph of a bound.

A graph that misses the cache is compared by its *structure* (``structure``: ops, operand
wiring, dtypes, ranks and every parameter that is not an integer) with the graphs of the same
structure seen before (a ``Family``). When the only differences are integers (shapes, integer
parameters) and each one is ``a*s + b`` (``a``, ``b`` integers) of the size ``s`` of one
dimension of the step's data (an input as the host sent it, or one marked with ``mark``;
never a program's output such as the model's state, whose buffers a step donates), that dimension is
dynamic from then on: a *size variable* stands for every input
dimension of that size, and the family's ``table`` says which integer follows which variable
how. Every later graph of the structure is checked against the table (every integer exactly as
predicted) and rewritten (``pad``) at the variables' bounds (``bucket``): integers at ``a*B + b``,
the real sizes as int32 parameters, and each node that touches a padded dimension lowered by
its family's rule (``lowering.padding``), which keeps the real values in the leading part of
every padded dimension and masks what would mix in the padding. A node without a rule, a rule
that refuses, or an output whose padded elements are not a leading block, leaves the
structure exact-shape, said once with the op and the user's line (``Refusal``).

The padded graph is an ordinary graph: the six merges key it (its nodes' signatures carry
their padded dimensions), the caches keep it, the compiler lowers it. ``Plan`` says how the
exact graph's parameters become the padded graph's (padded with zeros, sizes added) and how
its outputs come back to their real shapes.

Bounds: ``LAZYXLA_DYNAMIC_BUCKETS``: unset or ``auto`` (a program is compiled for the next power
of two, at least 8; a size's own bound is a quarter-octave step, ``own_bound``), ``pow2`` (powers
of two only), a list ``16,32,64`` (the smallest listed that holds the size; beyond it powers of
two), or ``off`` (one program per shape, as torch_xla). ``mark``
(``lazyxla.mark_dynamic(t, dim, max=)``) sets one input dimension's bound. A size whose own
bound has no program runs in the smallest compiled program of larger bounds until its padding
there has cost about a compile (``Rent``); one that no program holds compiles ``bucket``.

May touch: its own tables (families by structure, marks), the ``DynamicShape*`` counters and
the ``events.DYNAMIC`` subscribers. Knows nothing about torch ops beyond the rule table.
"""
from __future__ import annotations

import weakref

import torch

from . import events, metrics
from .config import env_str
from .hashing import encode, fold
from .ir import DEVICE_DATA, Node, OpSig, Slot, TensorMeta, fmt_where
from .lowering import padding
from .run.storage import from_host
from .backend.xla import leading, pad_zeros, scalar_array

MAX_SAMPLES = 8  # integer vectors kept per family to find a variable in


def _policy():
    text = env_str("LAZYXLA_DYNAMIC_BUCKETS", "auto").strip().lower()
    if text in ("off", "0", "false", "no", "none"):
        return None
    if text in ("", "auto", "1", "on", "true"):
        return "auto"
    if text == "pow2":
        return "pow2"
    try:
        return tuple(sorted(int(x) for x in text.split(",") if x.strip()))
    except ValueError:
        raise ValueError(f"LAZYXLA_DYNAMIC_BUCKETS={text!r}: expected auto, pow2, off, "
                         "or sizes like 16,32,64") from None


POLICY = _policy()
STEPS = (1.25, 1.5, 1.75, 2.0)  # ``auto``: a size's own bound within its octave (at most 1.25x the size)


def enabled() -> bool:
    return POLICY is not None


def bucket(size: int, mark=None) -> int:
    """The bound a new program is compiled for: ``mark`` (mark_dynamic's max), else the smallest
    listed bucket that holds the size, else the next power of two (at least 8)."""
    if mark is not None:
        return mark
    if type(POLICY) is tuple:
        for b in POLICY:
            if b >= size:
                return b
    b = 8
    while b < size:
        b *= 2
    return b


def own_bound(size: int, mark=None) -> int:
    """A size's own bound: ``bucket``, except under ``auto``, where it is the smallest of a
    quarter-octave ladder (8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ...) that holds the size, so
    its padding is at most a quarter of the work. A size runs in its own bound's program once
    that is compiled; until then in a larger bound's (``Rent``)."""
    b = bucket(size, mark)
    if mark is not None or POLICY != "auto" or b == 8:
        return b
    return next(int(b // 2 * f) for f in STEPS if b // 2 * f >= size)


# ---------------------------------------------------------------------------------------
# mark_dynamic: an input dimension's bound, said up front.
_MARKS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # storage -> {dim: max}


def mark(storage, shape, dim: int, max: int = None) -> None:  # noqa: A002 - torch's name
    """``lazyxla.mark_dynamic``: dimension ``dim`` of a tensor of ``shape`` whose value is
    ``storage`` is dynamic with bound ``max`` (default: its size's bucket)."""
    d = dim + len(shape) if dim < 0 else dim
    if not 0 <= d < len(shape):
        raise IndexError(f"lazyxla.mark_dynamic: dimension {dim} out of range for a tensor of shape {list(shape)}")
    size = shape[d]
    bound = bucket(size) if max is None else int(max)
    if size > bound:
        raise ValueError(f"lazyxla.mark_dynamic: dimension {d} has size {size}, above max={bound}")
    _MARKS.setdefault(storage, {})[d] = bound


def _mark_of(leaf, dim):
    ref = leaf.owner
    st = ref() if ref is not None else None
    marks = _MARKS.get(st) if st is not None else None
    return marks.get(dim) if marks else None


# ---------------------------------------------------------------------------------------
# A graph's structure and its integers.
class _Int:
    """Where an integer was, in a structure's encoding."""
    __slots__ = ()

    def __lazyxla_encode__(self):
        return b"I"


def _ints(x, out):
    """Append the integers of a template to ``out`` (depth first); bools are not integers."""
    t = type(x)
    if t is int:
        out.append(x)
    elif t is tuple or t is list:
        for y in x:
            _ints(y, out)


def _erased(x):
    t = type(x)
    if t is int:
        return _Int()
    if t is tuple or t is list:
        return tuple(_erased(y) for y in x)
    return x


def _replaced(x, it):
    """``x`` with its integers taken, in order, from the iterator ``it``."""
    t = type(x)
    if t is int:
        return next(it)
    if t is tuple or t is list:
        return tuple(_replaced(y, it) for y in x)
    return x


class Structure:
    """A graph without its integers: ``key`` (128-bit), ``ints`` (every integer, in order: per
    node its template's, then its outputs' dimensions), per node where its integers start
    (``starts``), and the integer positions that are parameters' dimensions (``leaf_dims``:
    position -> (parameter index, dimension))."""

    __slots__ = ("key", "ints", "starts", "leaf_dims", "fed")

    def __init__(self, graph):
        ints, starts, leaf_dims, parts = [], [], {}, []
        fed = set()  # parameters that are data, not state: their sizes may vary
        index = {id(n): i for i, n in enumerate(graph.post)}
        pindex = {id(p): i for i, p in enumerate(graph.params)}
        for n in graph.post:
            starts.append(len(ints))
            sig = n.sig
            if n.data is not None:
                m = sig.outs[0]
                parts.append(b"D" + encode(str(m.dtype)) + encode(len(m.shape)) + encode(sig.template))
                st = n.owner() if n.owner is not None else None
                if st is None or from_host(st, n) or st in _MARKS:
                    fed.add(pindex[id(n)])  # sent by the host, or a buffer no tensor holds any more
                for d, s in enumerate(m.shape):
                    leaf_dims[len(ints)] = (pindex[id(n)], d)
                    ints.append(s)
                continue
            opaque = sig.func is not None and not isinstance(sig.func, torch._ops.OpOverload)
            if opaque or padding.opaque(sig):
                parts.append(b"O" + sig.hb)  # lowered from more than its template: every integer counts
            else:
                parts.append(b"N" + encode(sig.op) + encode(_erased(sig.template)))
                _ints(sig.template, ints)
            for m in sig.outs:
                parts.append(encode(str(m.dtype)) + encode(len(m.shape)))
                ints.extend(m.shape)
            parts.append(encode(tuple((index[id(o)], i) for o, i in n.operands)))
        parts.append(encode(tuple((index[id(r)], i) for r, i in graph.roots)))
        self.key = fold(b"structure", *parts)
        self.ints = tuple(ints)
        self.starts = starts
        self.leaf_dims = leaf_dims
        self.fed = fed


# ---------------------------------------------------------------------------------------
# Families: graphs of one structure, and the table of what follows which size.
class Var:
    """A size variable: the parameters' dimensions (integer positions) that share one size."""
    __slots__ = ("positions", "label")

    def __init__(self, positions, label):
        self.positions = tuple(positions)
        self.label = label


class Family:
    __slots__ = ("samples", "vars", "table", "refused", "programs", "rents")

    def __init__(self):
        self.samples = []       # integer vectors seen, newest last
        self.vars = []          # Var, in the order found
        self.table = {}         # position -> (variable index, a, b); absent: the integer is constant
        self.refused = None     # a Refusal: this structure stays exact-shape
        self.programs = {}      # bounds (a tuple, one per variable) -> Cost of its padded program
        self.rents = {}         # bounds without a program of their own -> Rent paid in a larger one

    def remember(self, ints):
        """Keep an integer vector (the last ``MAX_SAMPLES`` distinct ones)."""
        if ints not in self.samples:
            self.samples.append(ints)
            del self.samples[:-MAX_SAMPLES]


_FAMILIES: dict = {}
MAX_FAMILIES = 4096  # structures remembered; beyond, the table starts again (as the warm-path memo)


def _family(key):
    fam = _FAMILIES.get(key)
    if fam is None:
        if len(_FAMILIES) >= MAX_FAMILIES:
            _FAMILIES.clear()
        fam = _FAMILIES[key] = Family()
    return fam, fam.samples == []


class Refusal:
    """Why a structure stays exact-shape: the op, the user's line, the reason."""
    __slots__ = ("op", "where", "why")

    def __init__(self, op, where, why):
        self.op, self.where, self.why = op, where, why

    def __str__(self):
        return f"{self.op} at {fmt_where(self.where)}: {self.why}" if self.where else f"{self.op}: {self.why}"


def _label(graph, st, positions):
    pos = positions[0]
    p, d = st.leaf_dims[pos]
    leaf = graph.params[p]
    user = next((n for n in graph.post if n.data is None and any(o is leaf for o, _ in n.operands)), None)
    at = f", used at {fmt_where(user.where)}" if user is not None and user.where else ""
    more = f" and {len(positions) - 1} more input dimension(s) of that size" if len(positions) > 1 else ""
    return f"dimension {d} of input {p} ({leaf.sig.outs[0]!r}{at}){more}"


def _predict(fam, ints, st):
    """The variables' sizes in ``ints`` if the family's table predicts every integer, else None."""
    sizes = []
    for v in fam.vars:
        vals = {ints[p] for p in v.positions}
        if len(vals) != 1:
            return None
        sizes.append(vals.pop())
    table = fam.table
    base = fam.samples[0]
    for p, x in enumerate(ints):
        t = table.get(p)
        if t is None:
            if x != base[p]:
                return None
        elif t[1] * sizes[t[0]] + t[2] != x:
            return None
    return sizes


def _new_variable(fam, graph, st, ints):
    """Find one more size variable from a sample that differs from ``ints`` in the sizes of one
    group of input dimensions only; extend the table with it. True when found."""
    for old in reversed(fam.samples):
        diff = [p for p, (x, y) in enumerate(zip(old, ints)) if x != y]
        if not diff:
            continue
        leaf = [p for p in diff if p in st.leaf_dims]
        if any(st.leaf_dims[p][0] not in st.fed for p in leaf):
            continue  # a size of the model's own state (weights, optimizer state) changed: not a batch's
        pairs = {(old[p], ints[p]) for p in leaf}
        if len(pairs) != 1:
            continue  # no input size changed (values, not shapes), or two at once: not separable here
        (s0, s1), = pairs
        # every input dimension of that size in both graphs is the same variable
        group = [p for p in st.leaf_dims if old[p] == s0 and ints[p] == s1 and st.leaf_dims[p][0] in st.fed]
        taken = {p for v in fam.vars for p in v.positions}
        if taken & set(group) or any(p in fam.table for p in diff):
            continue
        new = {}
        for p in diff:
            num = old[p] - ints[p]
            if num % (s0 - s1):
                break
            a = num // (s0 - s1)
            new[p] = (len(fam.vars), a, old[p] - a * s0)
        else:
            fam.vars.append(Var(group, _label(graph, st, group)))
            fam.table.update(new)
            return True
    return False


# ---------------------------------------------------------------------------------------
class Plan:
    """A graph's padded twin and how to run it: ``graph`` (the padded ``collect.Graph``),
    ``sources`` (per padded parameter: ``("param", i, pad)`` with ``pad`` the zero padding per
    dimension of the exact graph's parameter ``i``, or None; or ``("size", value)``), ``shapes``
    (per output: its real shape, or None when not padded, or how merged dimensions are cut),
    ``summary`` (the variables, sizes and bounds, in words)."""
    __slots__ = ("graph", "sources", "shapes", "summary", "family", "bounds", "rent")

    def donors(self, donors) -> tuple:
        """The padded graph's donated parameters: the exact graph's ``donors``, where they went
        (a padded input donates its padded copy)."""
        where = {s[1]: k for k, s in enumerate(self.sources) if s[0] == "param"}
        return tuple(sorted(where[d] for d in donors if d in where))


def observe(graph) -> bool:
    """Remember a graph's sizes without planning (found in the persistent cache, or a value read
    that may be answered on the host), so that the next size of its structure can be padded;
    whether graphs of its structure came with other sizes before."""
    if POLICY is None or not graph.params:
        return False
    st = Structure(graph)
    fam, _ = _family(st.key)
    fam.remember(st.ints)
    return len(fam.samples) > 1


def plan(graph, collect_graph):
    """The padded twin of ``graph`` (a ``collect.Graph`` that missed every cache), or None when
    it runs exact-shape (the first of its structure, sizes not (yet) explained by a variable,
    or a refusal). ``collect_graph`` makes a ``collect.Graph`` from roots."""
    if POLICY is None or not graph.params:
        return None
    st = Structure(graph)
    fam, new = _family(st.key)
    if new:
        fam.remember(st.ints)
        return None
    if fam.refused is not None:
        return None
    ints = st.ints
    sizes = _predict(fam, ints, st) if fam.vars else None
    if sizes is None:
        grew = _new_variable(fam, graph, st, ints)
        sizes = _predict(fam, ints, st) if grew else None
        if sizes is None or not all(_predict(fam, s, st) is not None for s in fam.samples):
            if grew:  # the new variable does not explain what came before: forget it
                fam.vars.pop()
                fam.table = {p: t for p, t in fam.table.items() if t[0] < len(fam.vars)}
            fam.remember(ints)
            return None
        for i in range(len(fam.vars) - (1 if grew else 0), len(fam.vars)):
            metrics.counter_inc("DynamicShapeDimension")
            _tell("dimension", fam.vars[i].label, sizes[i], bucket(sizes[i], _var_mark(graph, st, fam.vars[i])))
    for v in fam.vars:  # a buffer the user gave up (set_buffer_donation) is donated itself, not a padded copy
        for p in v.positions:
            owner = graph.params[st.leaf_dims[p][0]].owner
            if owner is not None and owner() is not None and owner().donate:
                return None
    marks = [_var_mark(graph, st, v) for v in fam.vars]
    marks = [m if m is not None and m >= s else None for m, s in zip(marks, sizes)]
    own = tuple(own_bound(s, m) for s, m in zip(sizes, marks))
    bounds, rent = _bounds(fam, own, sizes, marks)
    for i, (v, s, b) in enumerate(zip(fam.vars, sizes, bounds)):
        old = max((p[i] for p in fam.programs if len(p) > i), default=None)  # the largest compiled so far
        if old is not None and b > old:
            metrics.counter_inc("DynamicShapeBoundGrow")
            _tell("bound", v.label, s, b, old)
    got = _pad(graph, st, fam, sizes, bounds, collect_graph)
    if isinstance(got, Refusal):
        fam.refused = got
        metrics.counter_inc("DynamicShapeFallback")
        _tell("fallback", got)
        return None
    got.family, got.bounds, got.rent = fam, tuple(bounds), rent
    got.summary = "; ".join(f"{v.label}: size {s}, bound {b}" for v, s, b in zip(fam.vars, sizes, bounds))
    if rent is not None:
        got.summary += f" (its own bound would be {', '.join(map(str, own))}: not compiled yet)"
    return got


# ---------------------------------------------------------------------------------------
# Which bound's program a size runs in: its own bound's, or (rent) a larger one already compiled.
# Ski rental: a size whose own bound has no program yet runs in the smallest compiled program
# whose bounds hold it, and each of those runs pays the padding it adds (the larger program's
# measured execute time times the share of its work that is padding for this size). When what
# was paid reaches the larger program's compile time, the size's own bound is compiled. So the
# padding never costs more than about one compile, and a size seen a few times costs none.
UNKNOWN_COMPILE_S = 1.0  # a program loaded from the persistent cache: its compile time not measured


class Cost:
    """One padded program of a family: its compile seconds, its latest run's execute seconds."""
    __slots__ = ("compile_s", "last", "exec_s")

    def __init__(self, compile_s):
        self.compile_s = compile_s or UNKNOWN_COMPILE_S
        self.last = None    # the latest run's execution.Completion
        self.exec_s = None  # the latest known execute seconds

    def run_s(self):
        c = self.last
        if c is not None and c.seconds is not None:
            self.exec_s = c.seconds
        return self.exec_s


class Rent:
    """Bounds ``own`` without a program, running in the program of the larger bounds ``host``:
    the seconds of padding paid so far, and the runs."""
    __slots__ = ("own", "host", "paid", "runs", "share", "label")

    def __init__(self, own, host, label):
        self.own, self.host, self.label = own, host, label
        self.paid, self.runs = 0.0, 0
        volume = 1
        for a, b in zip(own, host):
            volume *= a / b
        self.share = 1.0 - volume  # of the host program's work, the padding beyond ``own``

    def due(self, fam) -> bool:
        """Whether ``own`` should now get its own program: it has one already, or the padding
        paid reached the host program's compile time."""
        host = fam.programs.get(self.host)
        return self.own in fam.programs or (host is not None and self.paid >= host.compile_s)


def _bounds(fam, own, sizes, marks):
    """The bounds a graph whose sizes' own bounds are ``own`` runs at, and its Rent (or None):
    ``own`` when compiled (or due); else the smallest compiled program that holds it, paying
    rent; else a new program at ``bucket`` (which ``own`` then rents, when smaller)."""
    if own in fam.programs:
        return own, None
    rent = fam.rents.get(own)
    if rent is not None:
        if not rent.due(fam):
            return rent.host, rent
        del fam.rents[own]
        _tell("own", rent.label, own, rent.host, rent.runs, rent.paid)
        return own, None
    hosts = [b for b in fam.programs if len(b) == len(own) and all(x >= y for x, y in zip(b, own))]
    host = min(hosts, key=lambda b: (_volume(b), b)) if hosts else tuple(bucket(s, m) for s, m in zip(sizes, marks))
    if host == own:
        return own, None
    label = "; ".join(f"{v.label}: size {s}" for v, s in zip(fam.vars, sizes))
    rent = fam.rents[own] = Rent(own, host, label)
    if hosts:
        metrics.counter_inc("DynamicShapeBoundRent")
        _tell("rent", label, own, host, fam.programs[host].compile_s)
    return host, rent


def _volume(bounds):
    v = 1
    for b in bounds:
        v *= b
    return v


def refuse(plan, why) -> None:
    """The padded twin of ``plan`` failed after it was planned: its structure stays exact-shape."""
    plan.family.refused = got = Refusal("the padded program", None, why)
    metrics.counter_inc("DynamicShapeFallback")
    _tell("fallback", got)


def _var_mark(graph, st, var):
    marks = [m for m in (_mark_of(graph.params[st.leaf_dims[p][0]], st.leaf_dims[p][1]) for p in var.positions)
             if m is not None]
    return min(marks) if marks else None


def describe(kind, *info) -> str:
    """One line for a ``dynamic`` event (the recompile log, ``PT_XLA_DEBUG_LEVEL``)."""
    if kind == "dimension":
        label, size, bound = info
        return (f"{label} is dynamic from now on (its size changed and every other change follows it): "
                f"size {size}, padded to {bound}; every size up to {bound} runs one program")
    if kind == "bound":
        label, size, bound, old = info
        return f"the bound of {label} grows from {old} to {bound} (size {size}): one more padded program"
    if kind == "rent":
        label, own, host, compile_s = info
        return (f"{label}: its bound {_fmt(own)} has no program yet, so it runs in the program of bound "
                f"{_fmt(host)} until the padding that adds has cost about that program's compile ({compile_s:.1f} s)")
    if kind == "own":
        label, own, host, runs, paid = info
        return (f"{label}: bound {_fmt(own)} gets its own program now: {runs} run(s) in the program of bound "
                f"{_fmt(host)} paid {paid:.2f} s of padding")
    return f"shapes stay exact for this graph, whose sizes vary: {info[0]}"


def _fmt(bounds):
    return ", ".join(map(str, bounds))


def _tell(kind, *info):
    for hook in events.DYNAMIC:
        hook(kind, *info)


# ---------------------------------------------------------------------------------------
# The padded twin.
SIZE_META = TensorMeta((), torch.int32)
class SizeMarker:
    """A size parameter's stand-in buffer in a padded graph (``PaddedCall`` passes the value)."""
    __slots__ = ()


class PaddedSig(OpSig):
    """A node's signature at the bounds: lowered by its rule (``lowering.padding``) around
    ``inner``, the op's own signature at the padded shapes; ``info`` is the rule's view of the
    padded dimensions (encoded in the template, so in the hash)."""
    __slots__ = ("inner", "info", "rule")


def _kinds(meta_ints, table, start):
    """Per dimension of a value whose shape's integers start at ``start``: None (not padded) or
    ("p", variable, a, b): the real size is ``a*s + b`` and the real values lead."""
    out = []
    for d in range(len(meta_ints)):
        t = table.get(start + d)
        out.append(None if t is None or t[1] == 0 else ("p", t[0], t[1], t[2]))
    return tuple(out)


def _pad(graph, st, fam, sizes, bounds, collect_graph):
    table = fam.table

    def at_bound(p, x):
        t = table.get(p)
        return x if t is None else t[1] * bounds[t[0]] + t[2]

    size_leaves = [Node(OpSig(DEVICE_DATA, None, None, ((), (("size", i),)), (SIZE_META,)), (), None, SizeMarker())
                   for i in range(len(fam.vars))]
    new = {}     # id(exact node) -> padded node
    kinds = {}   # id(padded node) -> per output, per dimension kinds
    sources = []
    ints = st.ints
    for i, n in enumerate(graph.post):
        start = st.starts[i]
        sig = n.sig
        if n.data is not None:
            m = sig.outs[0]
            k = _kinds(m.shape, table, start)
            if any(k):
                shape = tuple(at_bound(start + d, s) for d, s in enumerate(m.shape))
                pm = TensorMeta(shape, m.dtype)
                psig = OpSig(DEVICE_DATA, None, None, ((), (("padded", k),)), (pm,))
                pn = Node(psig, (), None, n.data)
                new[id(n)] = pn
                kinds[id(pn)] = (k,)
            else:
                kinds[id(n)] = (k,)
            continue
        operands = tuple((new.get(id(o), o), j) for o, j in n.operands)
        in_kinds = tuple(kinds[id(o)][j] for o, j in operands)
        n_tpl = len(ints) - start if i + 1 == len(graph.post) else st.starts[i + 1] - start
        n_tpl -= sum(len(m.shape) for m in sig.outs)
        tpl_pos = range(start, start + n_tpl)
        moving = {p - start: table[p] for p in tpl_pos if p in table and table[p][1] != 0}
        out_start = start + n_tpl
        out_kinds, o = [], out_start
        for m in sig.outs:
            out_kinds.append(_kinds(m.shape, table, o))
            o += len(m.shape)
        if not moving and not any(any(k) for k in in_kinds) and not any(any(k) for k in out_kinds):
            if any(p is not o for (p, _), (o, _) in zip(operands, n.operands)):
                pn = Node(sig, operands, n._at)  # nothing padded here, but it reads padded nodes' results
                new[id(n)] = pn
                kinds[id(pn)] = tuple(out_kinds)
            else:
                kinds[id(n)] = tuple(out_kinds)  # nothing padded here: the node as it is
            continue
        rule = padding.rule_for(sig)
        if rule is None:
            return Refusal(sig.op, n.where, "no padding rule for this op (lowering/padding.py), so it would "
                                            "compute over the padding")
        if moving and not rule.sizes:
            return Refusal(sig.op, n.where, "an integer parameter follows a padded size")
        it = iter(at_bound(p, ints[p]) for p in tpl_pos)
        inner_tpl = _replaced(sig.template, it)
        outs, o = [], out_start
        for m in sig.outs:
            outs.append(TensorMeta(tuple(at_bound(o + d, s) for d, s in enumerate(m.shape)), m.dtype))
            o += len(m.shape)
        inner = OpSig(sig.op, sig.func, sig.lower, inner_tpl, outs, sig.params_text, sig.cdtype)
        in_shapes = tuple(o.sig.outs[j].shape for o, j in operands)
        got = rule.check(padding.Ctx(inner, in_kinds, tuple(out_kinds), moving, sig.template, in_shapes))
        if isinstance(got, str):
            return Refusal(sig.op, n.where, got)
        out_kinds = got
        n_ops = len(operands)
        template = (tuple(Slot(j) for j in range(n_ops + len(size_leaves))),
                    (("info", (in_kinds, out_kinds, tuple(sorted(moving.items())))), ("inner", inner.hb)))
        psig = PaddedSig(sig.op, None, padding.lower_padded, template, outs, sig.params_text, sig.cdtype)
        psig.inner, psig.info, psig.rule = inner, (in_kinds, out_kinds, moving, n_ops), rule
        pn = Node(psig, operands + tuple((s, 0) for s in size_leaves), n._at)
        new[id(n)] = pn
        kinds[id(pn)] = out_kinds
    roots, shapes = [], []
    for r, j in graph.roots:
        pr = new.get(id(r), r)
        k = kinds[id(pr)][j]
        roots.append((pr, j))
        real = r.sig.outs[j].shape
        if not any(k):
            shapes.append(None)
        elif all(x is None or x[0] == "p" for x in k):
            shapes.append(real)
        else:  # merged dimensions: cut each part to its real size, then merge again
            padded, cut = [], []
            for x, n in zip(k, pr.sig.outs[j].shape):
                if x is None or x[0] == "p":
                    padded.append(n)
                    cut.append(n if x is None else x[2] * sizes[x[1]] + x[3])
                    continue
                for sub, sk in x[1]:
                    if sk is not None and sk[0] != "p":
                        return Refusal(r.sig.op, r.where, "an output keeps padded values merged twice")
                    padded.append(sub)
                    cut.append(sub if sk is None else sk[2] * sizes[sk[1]] + sk[3])
            shapes.append(("merged", tuple(padded), tuple(cut), real))
    pgraph = collect_graph(roots)
    exact_index = {id(p): i for i, p in enumerate(graph.params)}
    padded_of = {id(new[id(o)]): o for o in graph.params if id(o) in new}
    for p in pgraph.params:
        if type(p.data) is SizeMarker:
            sources.append(("size", sizes[dict(p.sig.template[1])["size"]]))
            continue
        orig = padded_of.get(id(p), p)
        i = exact_index[id(orig)]
        if orig is p:
            sources.append(("param", i, None))
        else:
            pad = tuple(b - s for s, b in zip(orig.sig.outs[0].shape, p.sig.outs[0].shape))
            sources.append(("param", i, pad))
    pl = Plan()
    pl.graph, pl.sources, pl.shapes = pgraph, tuple(sources), tuple(shapes)
    return pl


def reset() -> None:
    """Forget every family (tests; a new process starts empty)."""
    _FAMILIES.clear()


class PaddedCall:
    """The padded program called as the exact graph's: each parameter of the exact graph padded
    with zeros where the plan says, the sizes added, and each padded output cut back to its real
    shape. What a cache entry under the exact graph's key holds."""
    __slots__ = ("program", "sources", "shapes", "_sizes", "cost", "rent", "family")

    def __init__(self, padded, plan):
        """``padded``: the padded graph's ``cache.CachedProgram``."""
        self.program = padded.executable
        self.sources = plan.sources
        self.shapes = plan.shapes
        self._sizes = {}
        fam = self.family = plan.family
        cost = fam.programs.get(plan.bounds)
        if cost is None:
            cost = fam.programs[plan.bounds] = Cost(padded.compile_ns / 1e9)
        self.cost, self.rent = cost, plan.rent

    def ran(self, completion) -> bool:
        """One run was dispatched (``completion``, its end): a size in a larger bound's program
        pays its padding. True once its own bound is due: the cache entry holding this call
        should give way, so that the next lookup compiles that bound."""
        self.cost.last = completion
        rent = self.rent
        if rent is None:
            return False
        took = self.cost.run_s()
        if took is not None:
            rent.paid += took * rent.share
        rent.runs += 1
        return rent.due(self.family)

    def __call__(self, *arrays):
        args = []
        for s in self.sources:
            if s[0] == "size":
                a = self._sizes.get(s[1])
                if a is None:
                    a = self._sizes[s[1]] = scalar_array(s[1], torch.int32)
                args.append(a)
            else:
                a = arrays[s[1]]
                args.append(a if s[2] is None else pad_zeros(a, s[2]))
        outs = self.program(*args)
        shapes = self.shapes
        n = len(shapes)
        return tuple(o if i >= n or shapes[i] is None else
                     leading(o, shapes[i]) if shapes[i][0] != "merged" else
                     leading(o.reshape(shapes[i][1]), shapes[i][2]).reshape(shapes[i][3])
                     for i, o in enumerate(outs))

    def __getattr__(self, name):  # as_text(), cost_analysis(), ... of the padded program
        return getattr(self.program, name)
