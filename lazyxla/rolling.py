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
| carries | nodes alike in what uses them (a hash over their users, ``_ROUNDS`` deep, leaves by shape and dtype; a user with more than ``_WIDE`` operands alike at every position) that form a chain, each depending on the one before: values handed from one iteration to the next (``h_k``). The largest such class (of ``MIN_ITERATIONS - _EDGES`` or more: the first and last layers' may hash apart), earliest first; all its members, then every other one (a pre-norm layer's two norms look alike to that depth, half a layer apart). |
| template | iteration 0: every node that depends on ``h_0`` and not on ``h_1``, with ``h_1`` (in post-order: the roles), and the leaf-only ops they read (a weight's transpose: computed inside the body from the stacked leaves), unless iteration 1 has no leaf-only op in its place (the embedding the first layer reads): then it is read from outside. |
| iterations | from ``h_k``, each role is found among the users of its operands' counterparts: same signature, same operand positions, operands the carry, a role of the same iteration, a role of the iteration before (one more carry, the same in every iteration) or a value that does not depend on the loop (same shapes and dtypes). Until one role has no counterpart; then iterations before the first, each from its output (``h_0``) back through operands. |
| cut | the roles at which the loop could be cut instead, as few values crossing from one iteration to the next as now or fewer, fewest first (``_cuts``, counted on two copies of the template; a leaf-only op crosses nothing); up to ``_CANDIDATES`` are built and the loop with the most iterations, then the fewest carries, is taken: a layer's boundary, where only the hidden state crosses (a cut inside a layer where one value crosses too leaves half a layer unrolled at each end). |
| inputs | a value outside the loop that an iteration reads: the same node in every iteration is one input; other nodes, one row each of a stacked input (a layer's weights; a weight that is a row of a stack, ``select`` of device data (``param_stacks``), stays outside the body, so the rows are one strided slice of that stack; an earlier loop's rows are taken as that loop's stacked output, and a loop that reads them last row first runs from its last row). |
| outputs | a role whose value is used outside the loop (by later nodes or as a root) is stacked; the rows replace the copies' values. |
| worth it | at least ``MIN_ITERATIONS`` iterations (``LAZYXLA_ROLL_MIN``), a template with ``MIN_BODY`` ops or more. |

After a loop is taken, its nodes are out of the search and the next loop is looked for (a
training step's forward pass, then its backward pass). ``LAZYXLA_ROLL_LAYERS=0`` turns it off.

May touch: nothing; reads the IR, counts ``RolledLoops`` and ``RolledIterations``.
"""
from __future__ import annotations

import jax
from torch._ops import OpOverload

from . import metrics
from .config import env_flag, env_int
from .ir import fmt_where
from .lowering.rolled import lower_loop
from .lowering.program import selects_data
from .frontend.signature import op_info
from .backend.xla import jnp_dtype

ENABLED = env_flag("LAZYXLA_ROLL_LAYERS", True)
MIN_ITERATIONS = env_int("LAZYXLA_ROLL_MIN", 20)
MIN_BODY = 4
MAX_LOOPS = 4
_ROUNDS = 3
_CANDIDATES = 4  # other cuts of a loop tried, fewest crossing values first
_WIDE = 8  # a user with more operands (a stack, the optimizer's step) is alike at every position
# a class of carries may miss this many iterations: the first and last layers' copies are used
# otherwise within ``_ROUNDS`` (the embedding, the final norm) and hash apart; finding the
# iterations adds them back, and the loop must still hold ``MIN_ITERATIONS``
_EDGES = 2

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

    def workspace(self):
        """The abstract values of the buffers its stacked outputs are written into."""
        n = len(self.iters)
        return [jax.ShapeDtypeStruct((n,) + tuple(m.shape), jnp_dtype(m.dtype))
                for m in (self.roles[j].sig.outs[i] for j, i in self.outputs)]

    def lower_into(self, env):
        """Lower the loop inside the program being traced: reads its inputs from ``env`` and
        puts every copy's value that is used outside in it."""
        lower_loop(self, env)

    def __repr__(self):
        return f"<Loop {len(self.iters)} x {len(self.roles)} ops>"


def roll(post, roots, count=True):
    """``post`` with its repeated layers rolled: a list of nodes and ``Loop``s in an order that
    computes every operand first; ``post`` itself when nothing rolls. ``count``: the loops are
    counted (``RolledLoops``, ``RolledIterations``); not for a program's text (R10)."""
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
    for lp in loops if count else ():
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
        self.reads = [tuple(pos[id(o)] for o, _ in n.operands) for n in post]  # operands' positions
        for i, qs in enumerate(self.reads):
            wide = len(qs) > _WIDE
            for p, q in enumerate(qs):
                users[q].append((i, p))
                uses[q].append((i, -1 if wide else p))
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
            self._classes = sorted((g for g in groups.values() if len(g) >= max(2, MIN_ITERATIONS - _EDGES)),
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


def _find_loop(g, taken):
    """The first loop a chain of carries gives, cut again where the fewest values cross from one
    iteration to the next (a layer's boundary, where only the hidden state does)."""
    post = g.post
    why = None
    for cls in g.classes():
        members = [i for i in cls if id(post[i]) not in taken]
        cand = None
        # every member, then every other one: a class can hold two nodes of each layer that
        # look alike to some depth (a pre-norm layer's two norms), a half layer apart
        for anchors in (members, members[::2]):
            if len(anchors) < max(2, MIN_ITERATIONS - _EDGES) or not _reaches(g, anchors[0], anchors[1]) \
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
        for k, x in _cuts(base)[:_CANDIDATES]:
            if cand is not base and len(cand.iters) >= len(base.iters) and k > cand.carries:
                break  # the rest cross more values than one found as long: more carries
            anchors = [it[x] for it in base.iters]
            f2 = _carry_depth(g, anchors)
            if f2 is None:
                continue
            other, _ = _build(g, anchors, f2, taken)
            if other is not None and other.score() > cand.score():
                cand = other
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
    if len(template) < MIN_BODY:
        return None, (f"not rolled at {fmt_where(where)}: an iteration of {len(template)} ops "
                      f"(fewer than {MIN_BODY})")
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
    if not _carry_fits(post[a0], post[a1], desc):
        return None, f"not rolled at {fmt_where(where)}: the carry changes shape or dtype"
    iters = [template]
    carry = a1
    used = set(template)
    links = {}  # (role, operand) read from outside by iteration 0: None, or the role whose previous value it reads
    while True:
        it, failed = _extend(g, template, desc, carry, f, taken, used, iters[-1], links, lazy)
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
        it = _prepend(g, template, desc, out_role, iters[0], a0, links, taken, used, f, lazy)
        if it is None:
            break
        found, a0 = it
        iters.insert(0, found)
        used.update(found)
    if len(iters) < MIN_ITERATIONS:
        return None, (f"not rolled at {fmt_where(where)}: {len(iters)} alike iterations of {len(template)} ops "
                      f"(fewer than {MIN_ITERATIONS})")
    return _Cand(template, desc, iters, links, out_role, a0, where), None


def _stack_row(x):
    """Whether node ``x`` selects from device data (``select(data, 0, k)``: a parameter kept as
    a row of a stack, ``param_stacks``). Each iteration's is another row, so it is read from
    outside as a row of that input, and the loop takes the rows as one slice of the stack
    (``program.stack_rows``), never as a kernel per row."""
    return selects_data(x)


def _leaf_view(x):
    """Whether node ``x`` is a view of leaves (a weight's transpose: its op's schema returns an
    alias, ``FuncInfo.view``): another loop may take it as a leaf-only op of its own, so one
    reading it can go inside a body as well."""
    f = x.sig.func
    return type(f) is OpOverload and op_info(f).view and all(y.data is not None for y, _ in x.operands)


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


class _Match:
    """Finding one iteration's nodes role by role: ``found[j]`` (a position or None), the
    iteration's ``carry`` (position), ``prev_role`` (the iteration before: position -> role),
    ``links`` (held to, see ``_extend``) and ``lazy`` (leaf-only roles, such as a weight's
    transpose: found through the role that reads them)."""

    def __init__(self, g, template, desc, f, taken, used, lazy, links, carry=None, prev=()):
        self.g, self.template, self.desc, self.f = g, template, desc, f
        self.taken, self.used, self.lazy, self.links = taken, used, lazy, links
        self.found = [None] * len(template)
        self.carry = carry
        self.prev_role = {q: r for r, q in enumerate(prev)}
        self.outside = []  # positions read from outside (for _prepend's cycle check)

    def free(self, u):
        return u not in self.used and u not in self.found and id(self.g.post[u]) not in self.taken

    def alike(self, u, j):
        """Whether node ``u`` is role ``j``'s kind: the same op, signature and operand count (the
        rule both ways of finding an iteration start from: ``fits`` and ``_prepend``)."""
        return self.g.label[u] == self.g.label[self.template[j]] and len(self.g.post[u].operands) == len(self.desc[j])

    def fits(self, u, j, tent, new):
        """Whether node ``u`` can be role ``j`` given what is found (and tentatively: ``tent``)."""
        g = self.g
        n = g.post[u]
        ds = self.desc[j]
        if not self.alike(u, j):
            return False
        for pp, ((o, oi), d) in enumerate(zip(n.operands, ds)):
            q, k = g.pos[id(o)], d[0]
            if k == "carry":
                if q != self.carry or oi != d[1]:
                    return False
            elif k == "role":
                r = d[1]
                have = tent.get(r, self.found[r])
                if have is None and r in self.lazy:
                    if not self.free(q) or q in tent.values() or not self.fits(q, r, tent, new):
                        return False
                    tent[r] = have = q
                if q != have or oi != d[2]:
                    return False
            else:
                if not _same_input(o, oi, d):
                    return False
                key = (j, pp)
                r = self.prev_role.get(q)
                link = None if r is None else (r, oi)
                if r is None and self.f[q] != -1:
                    return False
                want = self.links.get(key, new.get(key, link))
                if want != link:
                    return False
                new[key] = link
        return True

    def among_users(self, j):
        """Role ``j``'s node among the users of its first loop operand's node, or None."""
        g = self.g
        ds = self.desc[j]
        for at, d in enumerate(ds):
            if d[0] == "carry" or (d[0] == "role" and self.found[d[1]] is not None):
                anchor = self.carry if d[0] == "carry" else self.found[d[1]]
                break
        else:
            return None
        for u, p in g.users[anchor]:
            if p != at or not self.free(u):
                continue
            tent, new = {}, {}
            if self.fits(u, j, tent, new):
                self.found[j] = u
                for r, q in tent.items():
                    self.found[r] = q
                self.links.update(new)
                for (jj, pp), link in new.items():
                    if link is None:
                        self.outside.append(g.pos[id(g.post[self.found[jj]].operands[pp][0])])
                return u
        return None


def _same_input(o, oi, d):
    """Whether output ``oi`` of node ``o`` can be the value from outside that descriptor ``d``
    (``("in", output, meta)``) of the template reads: the same output, shape and dtype."""
    return oi == d[1] and o.sig.outs[oi] == d[2]


def _extend(g, template, desc, carry, f, taken, used, prev, links, lazy):
    """The next iteration's nodes, role by role, from its carry (a position), and None; or None and
    the first role with no counterpart. ``prev``: the previous iteration's nodes; ``links``: what each value
    iteration 0 reads from outside is in the later ones (a value from outside, or a role's
    value in the iteration before: one more carry), set by the first call, held to after."""
    m = _Match(g, template, desc, f, taken, used, lazy, links, carry, prev)
    for j in range(len(template)):
        if j in lazy or m.found[j] is not None:
            continue
        if m.among_users(j) is None:
            return None, j
    if None in m.found:
        return None, m.found.index(None)
    return m.found, None


def _prepend(g, template, desc, out_role, first, carry, links, taken, used, f, lazy):
    """The iteration before ``first`` (whose carry is the node at ``carry``), role by role from
    its output (``carry``) through operands, then the roles not reached so (a layer's weight
    gradients) among their operands' users; (nodes, its carry) or None."""
    post, pos = g.post, g.pos
    m = _Match(g, template, desc, f, taken, used, lazy, dict(links))
    found = m.found
    found[out_role] = carry
    stack = [out_role]
    while stack:
        j = stack.pop()
        n = post[found[j]]
        if not m.alike(found[j], j):
            return None
        for p, ((o, oi), d) in enumerate(zip(n.operands, desc[j])):
            q, k = pos[id(o)], d[0]
            if k == "carry":
                if oi != d[1] or (m.carry is not None and m.carry != q):
                    return None
                m.carry = q
            elif k == "role":
                r = d[1]
                if oi != d[2]:
                    return None
                if found[r] is None:
                    if not m.free(q) or o.data is not None:
                        return None
                    found[r] = q
                    stack.append(r)
                elif found[r] != q:
                    return None
            else:
                if not _same_input(o, oi, d):
                    return None
                m.outside.append(q)
    c_in = m.carry
    if c_in is None:
        return None
    for j in range(len(template)):
        if found[j] is None and j not in lazy and m.among_users(j) is None:
            return None
    if None in found or len(set(found)) != len(found):
        return None
    if not _carry_fits(post[c_in], post[carry], desc):
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
    top = max(m.outside, default=-1)
    for i in range(c_in + 1, top + 1):
        if any(pos[id(o)] in dep for o, _ in post[i].operands):
            dep.add(i)
    if any(q in dep or q in mine for q in m.outside):
        return None
    return found, c_in


def _carry_fits(into, out, desc):
    """Whether node ``into`` can be the carry that the output role's node ``out`` hands on:
    every output the iterations read through the carry alike."""
    reads = {d[1] for ds in desc for d in ds if d[0] == "carry"}
    return all(i < len(into.sig.outs) and into.sig.outs[i] == out.sig.outs[i] for i in reads)


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
