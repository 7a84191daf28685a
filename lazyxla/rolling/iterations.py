"""Finding one iteration's nodes role by role: from its carry forward through the users of what is
found (``extend``), or from its output backward through operands (``prepend``, the iterations
before the first anchor).

Touches nothing.
"""
from __future__ import annotations


class _Match:
    """Finding one iteration's nodes role by role: ``found[j]`` (a position or None), the
    iteration's ``carry`` (position), ``prev_role`` (the iteration before: position -> role),
    ``links`` (held to, see ``extend``) and ``lazy`` (leaf-only roles, such as a weight's
    transpose: found through the role that reads them)."""

    def __init__(self, g, template, desc, f, taken, used, lazy, links, carry=None, prev=()):
        self.g, self.template, self.desc, self.f = g, template, desc, f
        self.taken, self.used, self.lazy, self.links = taken, used, lazy, links
        self.found = [None] * len(template)
        self.carry = carry
        self.prev_role = {q: r for r, q in enumerate(prev)}
        self.outside = []  # positions read from outside (for prepend's cycle check)

    def free(self, u):
        return u not in self.used and u not in self.found and id(self.g.post[u]) not in self.taken

    def alike(self, u, j):
        """Whether node ``u`` is role ``j``'s kind: the same op, signature and operand count (the
        rule both ways of finding an iteration start from: ``fits`` and ``prepend``)."""
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


def extend(g, template, desc, carry, f, taken, used, prev, links, lazy):
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


def prepend(g, template, desc, out_role, first, carry, links, taken, used, f, lazy):
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
    if not carry_fits(post[c_in], post[carry], desc):
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


def carry_fits(into, out, desc):
    """Whether node ``into`` can be the carry that the output role's node ``out`` hands on:
    every output the iterations read through the carry alike."""
    reads = {d[1] for ds in desc for d in ds if d[0] == "carry"}
    return all(i < len(into.sig.outs) and into.sig.outs[i] == out.sig.outs[i] for i in reads)
