"""A graph's structure, families of graphs of one structure, and their size variables.

A graph that misses the cache is compared by its *structure* (``Structure``: ops, operand
wiring, dtypes, ranks and every parameter that is not an integer) with the graphs of the same
structure seen before (a ``Family``). When the only differences are integers (shapes, integer
parameters) and each one is ``a*s + b`` (``a``, ``b`` integers) of the size ``s`` of one
dimension of the step's data (an input as the host sent it, or one marked with ``mark``;
never a program's output such as the model's state, whose buffers a step donates), that
dimension is dynamic from then on: a *size variable* (``Var``) stands for every input
dimension of that size, and the family's ``table`` says which integer follows which variable
how (``new_variable``). Every later graph of the structure is checked against the table
(``predict``: every integer exactly as predicted).

May touch: its table of families (``reset`` empties it).
"""
from __future__ import annotations

import torch

from ..hashing import encode, fold
from ..ir.user_line import fmt_where
from ..lowering import padding
from ..run.storage import from_host
from .bounds import MARKS

MAX_SAMPLES = 8  # integer vectors kept per family to find a variable in


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


def replaced(x, it):
    """``x`` with its integers taken, in order, from the iterator ``it``."""
    t = type(x)
    if t is int:
        return next(it)
    if t is tuple or t is list:
        return tuple(replaced(y, it) for y in x)
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
                if st is None or from_host(st, n) or st in MARKS:
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


def family_of(key):
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


def predict(fam, ints, st):
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


def new_variable(fam, graph, st, ints):
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


def reset() -> None:
    """Forget every family (tests; a new process starts empty)."""
    _FAMILIES.clear()
