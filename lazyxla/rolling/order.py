"""The stage's entry: ``roll`` finds up to ``settings.MAX_LOOPS`` loops in a post-order (``find``)
and orders the loops with the rest of the nodes, operands first.

May touch: the ``RolledLoops`` and ``RolledIterations`` counters, ``last_report``.
"""
from __future__ import annotations

from .. import metrics
from . import settings
from .find import Index, find_loop, last_report
from .loop import Loop


def roll(post, roots, count=True):
    """``post`` with its repeated layers rolled: a list of nodes and ``Loop``s in an order that
    computes every operand first; ``post`` itself when nothing rolls. ``count``: the loops are
    counted (``RolledLoops``, ``RolledIterations``); not for a program's text (R10)."""
    del last_report[:]
    if not settings.ENABLED or len(post) < settings.MIN_ITERATIONS * settings.MIN_BODY:
        return post
    g = Index(post, roots)
    loops = []
    taken = set()
    for _ in range(settings.MAX_LOOPS):
        loop = find_loop(g, taken)
        if loop is None:
            break
        loops.append(loop)
        taken.update(loop.members)
    if not loops:
        return post
    order = _order(g, loops)
    if order is None:
        last_report.append("not rolled: the loops depend on each other in a cycle")
        return post
    for lp in loops if count else ():
        metrics.counter_inc("RolledLoops")
        metrics.counter_inc("RolledIterations", len(lp.iters))
    return order


def _order(g, loops):
    """Nodes outside loops and the loops, operands first; None on a cycle."""
    post = g.post
    unit = {}
    for lp in loops:
        for it in lp.iters:
            for n in it:
                unit[id(n)] = lp
    deps = {}
    for lp in loops:
        ds = set()
        for it in lp.iters:
            for n in it:
                for o, _ in n.operands:
                    u = unit.get(id(o), o)
                    if u is not lp:
                        ds.add(id(u))
        deps[id(lp)] = ds
    objs = {id(lp): lp for lp in loops}
    for n in post:
        if id(n) not in unit:
            objs[id(n)] = n

    def operands_of(x):
        if type(x) is Loop:
            return deps[id(x)]
        return {id(unit.get(id(o), o)) for o, _ in x.operands}

    order, state = [], {}
    for n in post:
        start = unit.get(id(n), n)
        if state.get(id(start)) == 2:
            continue
        stack = [(start, False)]
        while stack:
            x, expanded = stack.pop()
            s = state.get(id(x))
            if expanded:
                state[id(x)] = 2
                order.append(x)
                continue
            if s == 2:
                continue
            if s == 1:
                return None  # on the current path: a cycle
            state[id(x)] = 1
            stack.append((x, True))
            for d in operands_of(x):
                sd = state.get(d)
                if sd == 1:
                    return None
                if sd != 2:
                    stack.append((objs[d], False))
    return order
