"""On a cache miss: the padded twin of a graph, or None (it runs exact-shape).

``plan`` finds the graph's family (``structure``), a variable that explains its sizes, the
bounds it runs at (``bounds``) and its padded twin (``twin``); ``observe`` only remembers a
graph's sizes; ``refuse`` keeps a structure exact-shape after its twin failed. Each decision is
told to the ``events.DYNAMIC`` subscribers (``messages``) and counted (``DynamicShape*``).

May touch: the families and the ``DynamicShape*`` counters.
"""
from __future__ import annotations

from .. import metrics
from .bounds import bounds_for, bucket, enabled, mark_of, own_bound
from .messages import tell
from .structure import Refusal, Structure, family_of, new_variable, predict
from .twin import pad


def observe(graph) -> bool:
    """Remember a graph's sizes without planning (found in the persistent cache, or a value read
    that may be answered on the host), so that the next size of its structure can be padded;
    whether graphs of its structure came with other sizes before."""
    if not enabled() or not graph.params:
        return False
    st = Structure(graph)
    fam, _ = family_of(st.key)
    fam.remember(st.ints)
    return len(fam.samples) > 1


def plan(graph, collect_graph):
    """The padded twin of ``graph`` (a ``collect.Graph`` that missed every cache), or None when
    it runs exact-shape (the first of its structure, sizes not (yet) explained by a variable,
    or a refusal). ``collect_graph`` makes a ``collect.Graph`` from roots."""
    if not enabled() or not graph.params:
        return None
    st = Structure(graph)
    fam, new = family_of(st.key)
    if new:
        fam.remember(st.ints)
        return None
    if fam.refused is not None:
        return None
    ints = st.ints
    sizes = predict(fam, ints, st) if fam.vars else None
    if sizes is None:
        grew = new_variable(fam, graph, st, ints)
        sizes = predict(fam, ints, st) if grew else None
        if sizes is None or not all(predict(fam, s, st) is not None for s in fam.samples):
            if grew:  # the new variable does not explain what came before: forget it
                fam.vars.pop()
                fam.table = {p: t for p, t in fam.table.items() if t[0] < len(fam.vars)}
            fam.remember(ints)
            return None
        for i in range(len(fam.vars) - (1 if grew else 0), len(fam.vars)):
            metrics.counter_inc("DynamicShapeDimension")
            tell("dimension", fam.vars[i].label, sizes[i], bucket(sizes[i], _var_mark(graph, st, fam.vars[i])))
    for v in fam.vars:  # a buffer the user gave up (set_buffer_donation) is donated itself, not a padded copy
        for p in v.positions:
            owner = graph.params[st.leaf_dims[p][0]].owner
            if owner is not None and owner() is not None and owner().donate:
                return None
    marks = [_var_mark(graph, st, v) for v in fam.vars]
    marks = [m if m is not None and m >= s else None for m, s in zip(marks, sizes)]
    own = tuple(own_bound(s, m) for s, m in zip(sizes, marks))
    bounds, rent = bounds_for(fam, own, sizes, marks)
    for i, (v, s, b) in enumerate(zip(fam.vars, sizes, bounds)):
        old = max((p[i] for p in fam.programs if len(p) > i), default=None)  # the largest compiled so far
        if old is not None and b > old:
            metrics.counter_inc("DynamicShapeBoundGrow")
            tell("bound", v.label, s, b, old)
    got = pad(graph, st, fam, sizes, bounds, collect_graph)
    if isinstance(got, Refusal):
        fam.refused = got
        metrics.counter_inc("DynamicShapeFallback")
        tell("fallback", got)
        return None
    got.family, got.bounds, got.rent = fam, tuple(bounds), rent
    got.summary = "; ".join(f"{v.label}: size {s}, bound {b}" for v, s, b in zip(fam.vars, sizes, bounds))
    if rent is not None:
        got.summary += f" (its own bound would be {', '.join(map(str, own))}: not compiled yet)"
    return got


def refuse(plan, why) -> None:
    """The padded twin of ``plan`` failed after it was planned: its structure stays exact-shape."""
    plan.family.refused = got = Refusal("the padded program", None, why)
    metrics.counter_inc("DynamicShapeFallback")
    tell("fallback", got)


def _var_mark(graph, st, var):
    marks = [m for m in (mark_of(graph.params[st.leaf_dims[p][0]], st.leaf_dims[p][1]) for p in var.positions)
             if m is not None]
    return min(marks) if marks else None
