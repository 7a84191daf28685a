"""Finding one loop in an indexed post-order: a chain of alike carries, the template (iteration
0's nodes), the iterations (``iterations``), the cut where the fewest values cross from one
iteration to the next, and the loop's inputs and outputs (``Loop``). Every step checks; any
doubt leaves the graph as it is and says why in ``last_report``.

May touch: ``last_report``.
"""
from __future__ import annotations

from torch._ops import OpOverload

from ..ir.user_line import fmt_where
from ..lowering import is_view
from ..lowering.program import platform, selects_data
from . import settings
from .work import flops
from .iterations import carry_fits, extend, prepend
from .loop import Loop

last_report: list = []  # why the last graph rolled or did not: one line per attempt


class Index:
    """Positions, users and labels of a post-order."""

    def __init__(self, post, roots):
        self.post = post
        self.pos = pos = {id(n): i for i, n in enumerate(post)}
        self.users = users = [[] for _ in post]
        self.uses = uses = [[] for _ in post]  # (user, position) for the hash: a variadic user's position is no structure
        self.reads = [tuple(pos[id(o)] for o, _ in n.operands) for n in post]  # operands' positions
        for i, qs in enumerate(self.reads):
            wide = len(qs) > settings.WIDE
            for p, q in enumerate(qs):
                users[q].append((i, p))
                uses[q].append((i, -1 if wide else p))
        self.roots = {id(n) for n, _ in roots}
        intern = {}
        self.label = [intern.setdefault(n.sig.hb, len(intern)) for n in post]
        self._classes = None

    def classes(self):
        """Op nodes grouped by a hash of what uses them, ``settings.ROUNDS`` deep (node positions)."""
        if self._classes is None:
            h = self.label
            users = self.uses
            for _ in range(settings.ROUNDS):
                h = [hash((h0, tuple(sorted((p, h[u]) for u, p in us)))) for h0, us in zip(self.label, users)]
            groups: dict = {}
            for i, n in enumerate(self.post):
                if n.data is None and n.operands:
                    groups.setdefault(h[i], []).append(i)
            least = max(2, settings.MIN_ITERATIONS - settings.EDGES)
            self._classes = sorted((g for g in groups.values() if len(g) >= least), key=lambda g: (-len(g), g[0]))
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


def _carry_depth(g, anchors):
    """For each node: the index of the last anchor it depends on (-1: none); None when the
    anchors are not a chain."""
    at = {a: k for k, a in enumerate(anchors)}
    f = [-1] * len(g.post)  # nothing before the first anchor depends on one
    reads = g.reads
    for i in range(anchors[0], len(f)):
        d = -1
        for q in reads[i]:
            x = f[q]
            if x > d:
                d = x
        k = at.get(i)
        if k is not None:
            if d != k - 1:
                return None
            d = k
        f[i] = d
    return f


def find_loop(g, taken):
    """The first loop a chain of carries gives, cut again where the fewest values cross from one
    iteration to the next (a layer's boundary, where only the hidden state does)."""
    post = g.post
    why = None
    least = max(2, settings.MIN_ITERATIONS - settings.EDGES)
    for cls in g.classes():
        members = [i for i in cls if id(post[i]) not in taken]
        cand = None
        # every member, then every other one: a class can hold two nodes of each layer that
        # look alike to some depth (a pre-norm layer's two norms), a half layer apart
        for anchors in (members, members[::2]):
            if len(anchors) < least or not _reaches(g, anchors[0], anchors[1]) \
                    or not _reaches(g, anchors[-2], anchors[-1]):
                continue
            f = _carry_depth(g, anchors)
            if f is None:
                continue
            cand, text = _build(g, anchors, f, taken)
            if cand is not None:
                break
            why = why or text
        if cand is None:
            continue
        base = cand
        for k, x in _cuts(base)[:settings.CANDIDATES]:
            if cand is not base and len(cand.iters) >= len(base.iters) and k > cand.carries:
                break  # the rest cross more values than one found as long: more carries
            anchors = [it[x] for it in base.iters]
            f2 = _carry_depth(g, anchors)
            if f2 is None:
                continue
            other, _ = _build(g, anchors, f2, taken)
            if other is not None and other.score() > cand.score():
                cand = other
        on = platform()
        floor = settings.min_work(on)
        work = flops(post[i] for i in cand.template) if floor else 0
        if work < floor:  # the loop would cost more per iteration than its body does (``work``)
            last_report.append(f"not rolled at {fmt_where(cand.where)}: {len(cand.iters)} iterations of "
                               f"~{work:,} operations each, fewer than the {floor:,} a loop's iteration must "
                               f"do to pay for itself on {on} (LAZYXLA_ROLL_MIN_WORK)")
            return None
        loop, text = _finish(g, cand)
        last_report.append(text)
        return loop
    if why:
        last_report.append(why)
    return None


def _cuts(c):
    """The roles at which a candidate could be cut instead, (crossing values, role), fewest first: a role
    on the chain (the next iteration's copy depends on it), counted on two iterations of the
    template (what a copy reads that neither depends on it nor is it, nor is a role that reads
    nothing an iteration hands on; the iteration before the two reads as negative nodes). Cuts
    with as many crossing values as the candidate's own are kept: another may hold one more
    iteration."""
    n = len(c.template)
    reads = [[] for _ in range(2 * n)]  # node (iteration * n + role) -> the nodes it reads
    for j, ds in enumerate(c.desc):
        for p, d in enumerate(ds):
            if d[0] == "role":
                reads[j].append(d[1])
                reads[n + j].append(n + d[1])
            elif d[0] == "carry":
                reads[n + j].append(c.out_role)
                reads[j].append(-1 - c.out_role)  # the iteration before's nodes: negative
            else:
                link = c.links.get((j, p))
                if link is not None:
                    reads[n + j].append(link[0])
                    reads[j].append(-1 - link[0])
    order = sorted(range(2 * n), key=lambda v: (v >= n, c.template[v % n]))  # topological
    free = set()  # roles that read nothing an iteration hands on (a weight's transpose): no crossing value
    for v in order[:n]:
        if all(r >= 0 and r in free for r in reads[v]):
            free.add(v)
    best = []
    for x in range(n):
        dep = {x}
        for v in order:
            if v != x and any(r in dep for r in reads[v]):
                dep.add(v)
        if n + x not in dep:
            continue  # not on the chain
        dep2 = {n + x}
        for v in order:
            if v >= n and v != n + x and any(r in dep2 for r in reads[v]):
                dep2.add(v)
        part = (dep - dep2 - {x}) | {n + x}
        crossing = {r for v in part for r in reads[v] if r not in part and r != x and r % n not in free}
        best.append((len(crossing), x))
    best.sort()
    return [(k, x) for k, x in best if k <= c.carries and x != c.out_role]


def _build(g, anchors, f, taken, kept=frozenset()):
    """A candidate from its anchors (each iteration's carry), or None and why. ``kept``: leaf-only
    ops read from outside rather than computed in the body."""
    post, pos = g.post, g.pos
    a0, a1 = anchors[0], anchors[1]
    template = [i for i, k in enumerate(f) if (k == 0 and i != a0) or i == a1]
    template = [i for i in template if id(post[i]) not in taken and post[i].data is None]
    where = post[a0].where
    if len(template) < settings.MIN_BODY:
        return None, (f"not rolled at {fmt_where(where)}: an iteration of {len(template)} ops "
                      f"(fewer than {settings.MIN_BODY})")
    # leaf-only ops this iteration reads (a weight's transpose or view) go inside the body: the
    # loop reads the stacked leaves, and XLA folds such ops into their readers; so do ops that
    # read an earlier loop's values or leaf-only ops (the backward pass's transpose of the
    # forward's transposed weight, in a layer the forward loop holds or not): the loop reads
    # that loop's stack whole, where one op per row outside would be a
    # kernel per row (XLA:CPU compiles a slice at each offset as a kernel of its own)
    inside = set(template)
    hang = set()
    for i in template:
        for o, _ in post[i].operands:
            q = pos[id(o)]
            if (q not in inside and q not in hang and q not in kept and o.data is None and o.operands and id(o) not in taken
                    and not _stack_row(o) and all(x.data is not None or id(x) in taken or _leaf_view(x) for x, _ in o.operands)):
                hang.add(q)
    template = sorted(inside | hang)
    role_of = {i: j for j, i in enumerate(template)}
    lazy = {role_of[q] for q in hang}
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
    if not carry_fits(post[a0], post[a1], desc):
        return None, f"not rolled at {fmt_where(where)}: the carry changes shape or dtype"
    iters = [template]
    carry = a1
    used = set(template)
    links = {}  # (role, operand) read from outside by iteration 0: None, or the role whose previous value it reads
    while True:
        it, failed = extend(g, template, desc, carry, f, taken, used, iters[-1], links, lazy)
        if it is None:
            # a leaf-only op that only iteration 0 reads (the embedding before the first
            # layer): its counterpart is no leaf-only op; read it from outside instead
            wrong = {template[d[1]] for d in desc[failed] if d[0] == "role" and d[1] in lazy}
            if len(iters) == 1 and wrong:
                return _build(g, anchors, f, taken, kept | wrong)
            break
        iters.append(it)
        used.update(it)
        carry = it[out_role]
    while True:  # iterations before the first anchor (alike in what uses them only from some depth on)
        it = prepend(g, template, desc, out_role, iters[0], a0, links, taken, used, f, lazy)
        if it is None:
            break
        found, a0 = it
        iters.insert(0, found)
        used.update(found)
    if len(iters) < settings.MIN_ITERATIONS:
        return None, (f"not rolled at {fmt_where(where)}: {len(iters)} alike iterations of {len(template)} ops "
                      f"(fewer than {settings.MIN_ITERATIONS})")
    return _Cand(template, desc, iters, links, out_role, a0, where), None


def _stack_row(x):
    """Whether node ``x`` selects from device data (``select(data, 0, k)``: a parameter kept as
    a row of a stack, ``param_stacks``). Each iteration's is another row, so it is read from
    outside as a row of that input, and the loop takes the rows as one slice of the stack
    (``program.stack_rows``), never as a kernel per row."""
    return selects_data(x)


def _leaf_view(x):
    """Whether node ``x`` is a view of leaves (a weight's transpose: its op's schema returns an
    alias, ``lowering.is_view``): another loop may take it as a leaf-only op of its own, so one
    reading it can go inside a body as well."""
    f = x.sig.func
    return type(f) is OpOverload and is_view(f) and all(y.data is not None for y, _ in x.operands)


class _Cand:
    """A loop found, before its inputs and outputs are worked out (``_finish``)."""

    def __init__(self, template, desc, iters, links, out_role, a0, where):
        self.template, self.desc, self.iters, self.links = template, desc, iters, links
        self.out_role, self.a0, self.where = out_role, a0, where

    @property
    def carries(self):
        """Values handed on besides the carry: what iteration 0 reads of the iteration before."""
        return sum(v is not None for v in self.links.values())

    def score(self):
        return (len(self.iters), -self.carries, -sum(d[0] == "out" for ds in self.desc for d in ds))


def _finish(g, c):
    """The ``Loop`` of a candidate and the report's line."""
    post = g.post
    template, desc, iters, links = c.template, c.desc, c.iters, c.links
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
    loop = Loop([post[i] for i in template], nodes, c.out_role, post[c.a0], operands, slots, outputs)
    carries = 1 + sum(s[0] == "carry" for s in slots)
    return loop, (f"rolled at {fmt_where(c.where)}: {len(iters)} iterations of {len(template)} ops, {carries} "
                  f"carries, {len(slots) - carries + 1} inputs, {len(outputs)} stacked outputs")


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
