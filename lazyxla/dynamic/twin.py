"""The padded twin: a graph rewritten at its variables' bounds, and the call that runs it as the
exact graph.

``pad`` rewrites every integer that follows a variable to ``a*B + b`` at the bound ``B``, adds
the real sizes as int32 parameters, and lowers each node that touches a padded dimension by its
family's rule (``lowering.padding``), which keeps the real values in the leading part of every
padded dimension and masks what would mix in the padding. A node without a rule, a rule that
refuses, or an output whose padded elements are not a leading block, is a ``Refusal``. The
padded graph is an ordinary graph: the six merges key it (its nodes' signatures carry their
padded dimensions), the caches keep it, the compiler lowers it. ``Plan`` says how the exact
graph's parameters become the padded graph's and how its outputs come back to their real
shapes; ``PaddedCall`` does it at every run.

May touch: nothing but what it makes (a run prices its rent: ``PaddedCall.ran``).
"""
from __future__ import annotations

import torch

from ..xla.client import leading, pad_zeros, scalar_array
from ..ir.node import DEVICE_DATA, Node, OpSig, Slot, TensorMeta
from ..lowering import padding
from .bounds import Cost
from .structure import Refusal, replaced


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


def pad(graph, st, fam, sizes, bounds, collect_graph):
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
        inner_tpl = replaced(sig.template, it)
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
