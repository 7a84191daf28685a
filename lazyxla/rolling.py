"""Roll repeated layers: a post-order whose repeated subgraphs become loops, before lowering.

A model that runs identical layers in a Python loop records the same subgraph once per layer
(other parameters, the same ops). Lowered as recorded, JAX traces and XLA compiles every copy:
compile time grows with depth. This stage finds the repetition in the IR and hands lowering a
``Loop`` in place of its copies: one body, traced once, run as one XLA while loop
(``lowering.rolled``). It runs after the graph hash and the cache lookup, on a cache miss only:
keys, explanations and the walk see the graph as recorded.

How a loop is found (every step checks; any doubt leaves the graph as it is):

| step | rule |
|---|---|
| carries | nodes alike in what uses them (a hash over their users, ``_ROUNDS`` deep, leaves by shape and dtype) that form a chain, each depending on the one before: the values handed from one iteration to the next (``h_k``). The largest such class, earliest first. |
| template | iteration 0: every node that depends on ``h_0`` and not on ``h_1``, with ``h_1`` (in post-order: the roles). |
| iterations | from ``h_k``, each role is found among the users of its operands' counterparts: same signature, same operand positions, operands the carry, a role of the same iteration, or a value that does not depend on the loop (same shapes and dtypes). Until one role has no counterpart. |
| inputs | a value outside the loop that an iteration reads: the same node in every iteration is one input; other nodes, one row each of a stacked input (a layer's weights; an earlier loop's rows are taken as that loop's stacked output). |
| outputs | a role whose value is used outside the loop (by later nodes or as a root) is stacked; the rows replace the copies' values. |
| worth it | at least ``MIN_ITERATIONS`` iterations (``LAZYXLA_ROLL_MIN``), a template with ``MIN_BODY`` ops or more. |

After a loop is taken, its nodes are out of the search and the next loop is looked for (a
training step's forward pass, then its backward pass). Opt-in: ``LAZYXLA_ROLL_LAYERS=1``.

May touch: nothing; reads the IR, counts ``RolledLoops`` and ``RolledIterations``.
"""
from __future__ import annotations

from . import metrics
from .config import env_flag, env_int
from .ir import fmt_where
from .lowering.rolled import lower_loop

ENABLED = env_flag("LAZYXLA_ROLL_LAYERS", False)  # opt-in: a rolled step runs slower (README)
MIN_ITERATIONS = env_int("LAZYXLA_ROLL_MIN", 20)
MIN_BODY = 4
MAX_LOOPS = 4
_ROUNDS = 3
_CANDIDATES = 16  # loops built and compared per search
_WIDE = 8  # a user with more operands (a stack, the optimizer's step) is alike at every position

last_report: list = []  # why the last graph rolled or did not: one line per attempt


class Loop:
    """One rolled loop: ``roles`` (iteration 0's nodes, in post-order, the template that is
    lowered), ``iters[k][j]`` the node of role ``j`` in iteration ``k``, ``out_role`` the role
    whose value is the next iteration's carry, ``carry_in`` the first iteration's carry (a
    node outside the loop), ``operands[j]`` each role's operands as ("carry", i) / ("role", j, i)
    / ("in", slot), ``slots[s]`` the loop's inputs: ("shared", (node, i)) or ("rows", [(node, i)
    per iteration]) or ("carry", (node, i), (role, i)): one more carry, its first value from
    outside, the next the role's; ``outputs`` the (role, output index) pairs stacked for use
    outside."""

    __slots__ = ("roles", "iters", "out_role", "carry_in", "operands", "slots", "outputs", "members")

    def __init__(self, roles, iters, out_role, carry_in, operands, slots, outputs):
        self.roles = roles
        self.iters = iters
        self.out_role = out_role
        self.carry_in = carry_in
        self.operands = operands
        self.slots = slots
        self.outputs = outputs
        self.members = {id(n): (k, j) for k, it in enumerate(iters) for j, n in enumerate(it)}

    data = None  # never a device-data leaf (build_program's filter asks)

    def lower_into(self, env):
        """Lower the loop inside the program being traced: reads its inputs from ``env`` and
        puts every copy's value that is used outside in it."""
        lower_loop(self, env)

    def __repr__(self):
        return f"<Loop {len(self.iters)} x {len(self.roles)} ops>"


def roll(post, roots):
    """``post`` with its repeated layers rolled: a list of nodes and ``Loop``s in an order that
    computes every operand first; ``post`` itself when nothing rolls."""
    del last_report[:]
    if not ENABLED or len(post) < MIN_ITERATIONS * MIN_BODY:
        return post
    g = _Index(post, roots)
    loops = []
    taken = set()
    for _ in range(MAX_LOOPS):
        loop = _find_loop(g, taken)
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
    for lp in loops:
        metrics.counter_inc("RolledLoops")
        metrics.counter_inc("RolledIterations", len(lp.iters))
    return order


class _Index:
    """Positions, users and labels of a post-order."""

    def __init__(self, post, roots):
        self.post = post
        self.pos = pos = {id(n): i for i, n in enumerate(post)}
        self.users = users = [[] for _ in post]
        self.uses = uses = [[] for _ in post]  # (user, position) for the hash: a variadic user's position is no structure
        for i, n in enumerate(post):
            wide = len(n.operands) > _WIDE
            for p, (o, _) in enumerate(n.operands):
                users[pos[id(o)]].append((i, p))
                uses[pos[id(o)]].append((i, -1 if wide else p))
        self.roots = {id(n) for n, _ in roots}
        intern = {}
        self.label = [intern.setdefault(n.sig.hb, len(intern)) for n in post]
        self._classes = None

    def classes(self):
        """Op nodes grouped by a hash of what uses them, ``_ROUNDS`` deep (node positions)."""
        if self._classes is None:
            h = self.label
            users = self.uses
            for _ in range(_ROUNDS):
                h = [hash((h0, tuple(sorted((p, h[u]) for u, p in us)))) for h0, us in zip(self.label, users)]
            groups: dict = {}
            for i, n in enumerate(self.post):
                if n.data is None and n.operands:
                    groups.setdefault(h[i], []).append(i)
            self._classes = sorted((g for g in groups.values() if len(g) >= MIN_ITERATIONS),
                                   key=lambda g: (-len(g), g[0]))
        return self._classes


def _reaches(g, a, b):
    """Whether node position ``b`` depends on position ``a`` (a search over users up to ``b``)."""
    stack, seen = [a], {a}
    users = g.users
    while stack:
        i = stack.pop()
        for u, _ in users[i]:
            if u == b:
                return True
            if u < b and u not in seen:
                seen.add(u)
                stack.append(u)
    return False


def _carry_depth(g, anchors, taken):
    """For each node: the index of the last anchor it depends on (-1: none); None when the
    anchors are not a chain."""
    at = {a: k for k, a in enumerate(anchors)}
    f = [-1] * len(g.post)
    pos = g.pos
    for i, n in enumerate(g.post):
        d = -1
        for o, _ in n.operands:
            x = f[pos[id(o)]]
            if x > d:
                d = x
        k = at.get(i)
        if k is not None:
            if d != k - 1:
                return None
            d = k
        f[i] = d
    return f


def _find_loop(g, taken):
    """The best of the first ``_CANDIDATES`` loops the chains of carries give: most iterations,
    then fewest carries and inputs (a cut where one value crosses from layer to layer)."""
    post = g.post
    best, tried, why = None, 0, None
    for cls in g.classes():
        members = [i for i in cls if id(post[i]) not in taken]
        if len(members) < MIN_ITERATIONS:
            continue
        if not _reaches(g, members[0], members[1]) or not _reaches(g, members[-2], members[-1]):
            continue
        f = _carry_depth(g, members, taken)
        if f is None:
            continue
        loop, text = _build(g, members, f, taken)
        if loop is None:
            why = why or text
            continue
        if best is None or _score(loop) > _score(best[0]):
            best = (loop, text)
        tried += 1
        if tried >= _CANDIDATES:
            break
    if best is None:
        if why:
            last_report.append(why)
        return None
    last_report.append(best[1])
    return best[0]


def _score(loop):
    return (len(loop.iters), -sum(s[0] == "carry" for s in loop.slots), -len(loop.slots))


def _build(g, anchors, f, taken):
    post, pos = g.post, g.pos
    a0, a1 = anchors[0], anchors[1]
    carry_node = post[a0]
    template = [i for i, k in enumerate(f) if (k == 0 and i != a0) or i == a1]
    template = [i for i in template if id(post[i]) not in taken and post[i].data is None]
    where = post[a0].where
    if len(template) < MIN_BODY:
        return None, None
    if post[a1].sig.outs != carry_node.sig.outs:
        return None, f"not rolled at {fmt_where(where)}: the carry changes shape or dtype"
    role_of = {i: j for j, i in enumerate(template)}
    out_role = role_of[a1]
    # each role's operands relative to the template
    desc = []
    for i in template:
        ds = []
        for o, oi in post[i].operands:
            p = pos[id(o)]
            if p == a0:
                ds.append(("carry", oi))
            elif p in role_of:
                ds.append(("role", role_of[p], oi))
            elif f[p] == -1:
                ds.append(("out", oi, o.sig.outs[oi]))
            else:
                return None, (f"not rolled at {fmt_where(where)}: iteration 0 reads a value of an earlier one "
                              f"({o.sig.op}) besides the carry")
        desc.append(ds)
    iters = [template]
    carry = a1
    used = set(template)
    links = {}  # (role, operand) read from outside by iteration 0: None, or the role whose previous value it reads
    while True:
        it = _extend(g, template, desc, carry, f, taken, used, iters[-1], links)
        if it is None:
            break
        iters.append(it)
        used.update(it)
        carry = it[out_role]
    while True:  # iterations before the first anchor (alike in what uses them only from some depth on)
        it = _prepend(g, template, desc, out_role, iters[0], a0, links, taken, used)
        if it is None:
            break
        found, a0 = it
        iters.insert(0, found)
        used.update(found)
        carry_node = post[a0]
    if len(iters) < MIN_ITERATIONS:
        return None, (f"not rolled at {fmt_where(where)}: {len(iters)} alike iterations of {len(template)} ops "
                      f"(fewer than {MIN_ITERATIONS})")
    # inputs: one slot per (role, operand) read from outside
    operands, slots = [], []
    for j, ds in enumerate(desc):
        ops = []
        for p, d in enumerate(ds):
            if d[0] != "out":
                ops.append(d)
                continue
            vals = [post[it[j]].operands[p] for it in iters]
            first = vals[0]
            if links.get((j, p)) is not None:
                slots.append(("carry", first, links[(j, p)]))
            elif all(v[0] is first[0] and v[1] == first[1] for v in vals):
                slots.append(("shared", first))
            else:
                slots.append(("rows", vals))
            ops.append(("in", len(slots) - 1))
        operands.append(tuple(ops))
    members = set()
    for it in iters:
        members.update(it)
    outputs = []
    for j in range(len(template)):
        for oi in range(len(post[template[j]].sig.outs)):
            if _used_outside(g, [it[j] for it in iters], oi, members):
                outputs.append((j, oi))
    nodes = [[post[i] for i in it] for it in iters]
    loop = Loop([post[i] for i in template], nodes, out_role, carry_node, operands, slots, outputs)
    carries = 1 + sum(s[0] == "carry" for s in slots)
    return loop, (f"rolled at {fmt_where(where)}: {len(iters)} iterations of {len(template)} ops, {carries} carries, "
                  f"{len(slots) - carries + 1} inputs, {len(outputs)} stacked outputs")


def _extend(g, template, desc, carry, f, taken, used, prev, links):
    """The next iteration's nodes, role by role, from its carry (a position); None if a role
    has no counterpart. ``prev``: the previous iteration's nodes; ``links``: what each value
    iteration 0 reads from outside is in the later ones (a value from outside, or a role's
    value in the iteration before: one more carry), set by the first call, held to after."""
    post, pos, users, label = g.post, g.pos, g.users, g.label
    found = [0] * len(template)
    mine = set()
    prev_role = {q: r for r, q in enumerate(prev)}
    new = {}
    for j, i in enumerate(template):
        ds = desc[j]
        anchor = None
        for p, d in enumerate(ds):
            if d[0] == "carry":
                anchor, at = carry, p
                break
            if d[0] == "role":
                anchor, at = found[d[1]], p
                break
        if anchor is None:
            return None  # a role that reads nothing of the loop (cannot happen: it depends on h_0)
        want = label[i]
        hit = None
        for u, p in users[anchor]:
            if p != at or label[u] != want or u in used or u in mine or id(post[u]) in taken:
                continue
            ops = post[u].operands
            if len(ops) != len(ds):
                continue
            ok = True
            for pp, ((o, oi), d) in enumerate(zip(ops, ds)):
                k = d[0]
                q = pos[id(o)]
                if k == "carry":
                    ok = q == carry and oi == d[1]
                elif k == "role":
                    ok = q == found[d[1]] and oi == d[2]
                else:
                    ok = oi == d[1] and o.sig.outs[oi] == d[2]
                    if ok:
                        key = (j, pp)
                        r = prev_role.get(q)
                        link = None if r is None else (r, oi)
                        if r is None and f[q] != -1:
                            ok = False
                        elif key in links:
                            ok = links[key] == link
                        else:
                            new[key] = link
                if not ok:
                    break
            if ok:
                hit = u
                links.update(new)
                break
            new.clear()
        if hit is None:
            return None
        found[j] = hit
        mine.add(hit)
    return found


def _prepend(g, template, desc, out_role, first, carry, links, taken, used):
    """The iteration before ``first`` (whose carry is the node at ``carry``), role by role from
    its output (``carry``) through operands; (nodes, its carry) or None."""
    post, pos, label = g.post, g.pos, g.label
    found = [None] * len(template)
    found[out_role] = carry
    c_in = None
    outside = []
    stack = [out_role]
    while stack:
        j = stack.pop()
        n = post[found[j]]
        if label[found[j]] != label[template[j]] or len(n.operands) != len(desc[j]):
            return None
        for p, ((o, oi), d) in enumerate(zip(n.operands, desc[j])):
            q, k = pos[id(o)], d[0]
            if k == "carry":
                if oi != d[1] or (c_in is not None and c_in != q):
                    return None
                c_in = q
            elif k == "role":
                r = d[1]
                if oi != d[2]:
                    return None
                if found[r] is None:
                    if q in used or id(o) in taken or o.data is not None:
                        return None
                    found[r] = q
                    stack.append(r)
                elif found[r] != q:
                    return None
            else:
                if oi != d[1] or o.sig.outs[oi] != d[2]:
                    return None
                outside.append(q)
    if c_in is None:
        return None
    # the roles not reached from the output (a layer's weight gradients): among their operands' users
    users = g.users
    for j, t in enumerate(template):
        if found[j] is not None:
            continue
        ds = desc[j]
        at = next((p for p, d in enumerate(ds) if d[0] in ("carry", "role")), None)
        if at is None:
            return None
        d = ds[at]
        anchor = c_in if d[0] == "carry" else found[d[1]]
        hit = None
        for u, p in users[anchor]:
            if p != at or label[u] != label[t] or u in used or u in found or id(post[u]) in taken:
                continue
            ops = post[u].operands
            if len(ops) != len(ds):
                continue
            reads = []
            for (o, oi), d in zip(ops, ds):
                q, k = pos[id(o)], d[0]
                if k == "carry":
                    ok = q == c_in and oi == d[1]
                elif k == "role":
                    ok = q == found[d[1]] and oi == d[2]
                else:
                    ok = oi == d[1] and o.sig.outs[oi] == d[2]
                    reads.append(q)
                if not ok:
                    break
            else:
                hit = u
                outside.extend(reads)
                break
        if hit is None:
            return None
        found[j] = hit
    if len(set(found)) != len(found):
        return None
    if post[c_in].sig.outs != post[carry].sig.outs:
        return None
    # what the later first iteration read from outside as a carry's start is this one's role
    for (j, p), link in links.items():
        if link is not None:
            o, oi = post[first[j]].operands[p]
            if pos[id(o)] != found[link[0]] or oi != link[1]:
                return None
    # nothing it reads from outside may depend on its own carry
    mine = set(found)
    dep = {c_in}
    top = max(outside, default=-1)
    for i in range(c_in + 1, top + 1):
        if any(pos[id(o)] in dep for o, _ in post[i].operands):
            dep.add(i)
    if any(q in dep or q in mine for q in outside):
        return None
    return found, c_in


def _used_outside(g, positions, oi, members):
    for i in positions:
        if id(g.post[i]) in g.roots:
            return True
        n = g.post[i]
        for u, _ in g.users[i]:
            if u not in members:
                if any(o is n and x == oi for o, x in g.post[u].operands):
                    return True
    return False


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
