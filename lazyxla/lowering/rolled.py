"""A rolled loop (``rolling.Loop``) as one XLA loop: its template lowered once, as the body.

The carry is every output of the carry node, kept at PyTorch's dtypes; the loop is a
``fori_loop`` writing each iteration's outputs into buffers (``_run``). The loop's inputs are
its shared values (closed over) and its per-iteration values, stacked (a stack another loop
produced is taken whole, reversed when its rows are read last first). Each role whose value is
used outside is a stacked output; the copies' values are its rows, sliced when read
(``_Rows``). Value checks reported inside the body become stacked flags and values, reported
once for the loop (the first iteration that fails gives the value).

May touch: the value-check state of ``program`` while the body is traced.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..xla import jnp_dtype
from . import program


class _Rows:
    """Iteration ``k``'s outputs of one role: ``stacks[i]`` (or None) holds output ``i`` of
    every iteration; indexing slices row ``k`` (once)."""

    __slots__ = ("stacks", "k", "cache")

    def __init__(self, stacks, k):
        self.stacks = stacks
        self.k = k
        self.cache = {}

    def __getitem__(self, i):
        v = self.cache.get(i)
        if v is None:
            s = self.stacks[i]
            if s is None:
                raise KeyError(f"output {i} of a rolled node is not kept")
            v = self.cache[i] = s[self.k]
            program.note_row(v, s, self.k)
        return v


def _run(body, carry0, xs, n, reverse):
    """``lax.scan(body, carry0, xs, reverse=reverse)``'s stacked outputs, written into the
    program's workspace (its last arguments, kept from the run before: ``WorkspaceCall``), so
    nothing fills them first; the value checks' rows (and any output when there is no
    workspace) start as fills of distinct values (scan's one shared fill of zeros per shape
    was copied into each buffer). A 48 MB example: scan 15.5 ms, distinct fills 11.4 (14.3 in
    another run), workspace 7.8."""
    x0 = tuple(jax.ShapeDtypeStruct(a.shape[1:], a.dtype) for a in xs)
    _, out = jax.eval_shape(body, carry0, x0)  # the outputs' shapes (and the body's checks)
    flat, tree = jax.tree_util.tree_flatten(out)
    given = program._workspace[:len(out[0])]  # the program's workspace arguments (its stacked outputs), in loop order
    del program._workspace[:len(given)]
    bufs = tuple(given) + tuple(jnp.full((n,) + tuple(o.shape), False if o.dtype == jnp.bool_ else k + 1, o.dtype)
                                for k, o in enumerate(flat[len(given):]))

    def step(i, state):
        carry, bufs = state
        at = n - 1 - i if reverse else i
        x = tuple(jax.lax.dynamic_index_in_dim(a, at, 0, keepdims=False) for a in xs)
        carry, out = body(carry, x)
        leaves = jax.tree_util.tree_leaves(out)
        return carry, tuple(jax.lax.dynamic_update_index_in_dim(b, y, at, 0) for b, y in zip(bufs, leaves))

    _, bufs = jax.lax.fori_loop(0, n, step, (carry0, bufs))
    program.workspace_out.extend(bufs[:len(given)])
    return jax.tree_util.tree_unflatten(tree, list(bufs))


def _as_carry(xs, metas):
    return tuple(jax.lax.convert_element_type(x, jnp_dtype(m.dtype)) for x, m in zip(xs, metas))


def lower_loop(loop, env):
    roles, operands, outputs, out_role = loop.roles, loop.operands, loop.outputs, loop.out_role
    metas = roles[out_role].sig.outs
    c0 = env[id(loop.carry_in)]
    reads = {d[1] for ops in operands for d in ops if d[0] == "carry"}  # the outputs the first iteration reads
    carry0 = _as_carry([c0[i] if i in reads else jnp.zeros(m.shape, jnp_dtype(m.dtype)) for i, m in enumerate(metas)],
                       metas)
    shared, rows, xs, carried, nexts = {}, {}, [], {}, []
    # an earlier loop's stacks read last row first (a backward pass reading its forward pass's
    # values): the loop runs from its last row (``reverse``), so no stack is flipped
    runs = {s: program.row_run([env[id(n)][i] for n, i in v])
            for s, (kind, v, *_) in enumerate(loop.slots) if kind == "rows"}
    reverse = any(r is not None for r in runs.values()) and all(r is None or r[1] == -1 for r in runs.values())
    for s, (kind, v, *rest) in enumerate(loop.slots):
        if kind == "shared":
            n, i = v
            shared[s] = env[id(n)][i]
        elif kind == "carry":
            n, i = v
            carried[s] = len(metas) + len(nexts)
            nexts.append(rest[0])
            carry0 = carry0 + (env[id(n)][i],)
        else:
            rows[s] = len(xs)
            if reverse:
                r = runs[s]
                xs.append(r[0] if r is not None else program.stack_rows([env[id(n)][i] for n, i in v[::-1]]))
            else:
                xs.append(program.stack_rows([env[id(n)][i] for n, i in v]))
    types = [(a.dtype, a.shape) for a in carry0]
    outer = program._checks
    found = []  # the checks reported inside the body: (op, where, text, kind)

    def body(carry, x):
        vals = [None] * len(roles)
        was_node = program._node
        if outer is not None:
            program._checks = []
        try:
            for j, t in enumerate(roles):
                args = []
                for d in operands[j]:
                    k = d[0]
                    if k == "carry":
                        args.append(carry[d[1]])
                    elif k == "role":
                        args.append(vals[d[1]][d[2]])
                    else:
                        s = d[1]
                        args.append(shared[s] if s in shared else carry[carried[s]] if s in carried else x[rows[s]])
                program._node = t
                vals[j] = program.lower_node(t, args)
            checks = program._checks if outer is not None else []
        finally:
            program._node = was_node
            program._checks = outer
        found[:] = [c[2:] for c in checks]
        ys = tuple(vals[j][i] for j, i in outputs)
        flags = tuple(c[0] for c in checks)
        values = tuple(jnp.asarray(c[1]).astype(jnp.int64) for c in checks)
        out = _as_carry(vals[out_role], metas) + tuple(vals[r][i] for r, i in nexts)
        out = tuple(jax.lax.convert_element_type(o, t) for o, (t, _) in zip(out, types))
        return out, (ys, flags, values)

    ys, flags, values = _run(body, carry0, tuple(xs), len(loop.iters), reverse)
    for (op, where, text, kind), f, v in zip(found, flags, values):
        first = (f.shape[0] - 1 - jnp.argmax(jnp.flip(f, 0))) if reverse else jnp.argmax(f)
        outer.append((jnp.any(f), v[first], op, where, text, kind))
    width = {}
    for (j, i), y in zip(outputs, ys):
        width.setdefault(j, {})[i] = y
    for j, per in width.items():
        stacks = [per.get(i) for i in range(len(roles[j].sig.outs))]
        last = len(loop.iters) - 1
        for k, it in enumerate(loop.iters):
            env[id(it[j])] = _Rows(stacks, last - k if reverse else k)
