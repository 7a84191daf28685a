"""A rolled loop (``rolling.Loop``) as one XLA loop: its template lowered once, as the body.

The carry is every output of the carry node, kept at PyTorch's dtypes; the loop is a
``fori_loop`` writing each iteration's outputs into buffers (``_run``), which start as
``STACK_BUFFERS`` says for the platform. The loop's inputs are
its shared values (closed over) and its per-iteration values, stacked (a stack another loop
produced is taken whole, reversed when its rows are read last first). Each role whose value is
used outside is a stacked output; the copies' values are its rows, sliced when read
(``_Rows``). Value checks reported inside the body are kept in the loop's state (whether any
iteration failed, the first failing one's value) and reported once for the loop.

May touch: the trace state of ``program`` (its checks, workspace and rows) while the loop is traced.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..xla.client import jnp_dtype
from . import program


# platform -> where a loop's stacked outputs are written: every row is written before any is
# read, so a buffer's first contents are never seen
STACK_BUFFERS = {
    # the program's workspace: arguments kept from the run before and donated back (a 48 MB
    # example: 7.8 ms, against 11.4 for fills of distinct values and 15.5 for scan's shared fill)
    "cpu": "workspace",
    # XLA's uninitialized buffers (``jax.lax.empty``: the AllocateBuffer custom call): no fill,
    # and the layout is XLA's choice. A workspace there held the stacks between steps (GPT-2
    # 124M rolled, 8 x 1024: 5.5 GB) and an argument's fixed layout made XLA copy two of them
    # into the loop's layout and out again (bf16[12,3072,8192]: 7.75M cycles each, estimated)
    "tpu": "empty",
    "gpu": "empty",
}


def stack_buffers(platform: str) -> str:
    """How a rolled loop's stacked outputs start on ``platform`` (``STACK_BUFFERS``; a platform
    not in it: a fill, which every backend has)."""
    return STACK_BUFFERS.get(platform, "fill")


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
            v = self.cache[i] = self.row(i).value()
        return v

    def row(self, i):
        """Output ``i`` as a ``program.Row``: not sliced until a value is needed."""
        s = self.stacks[i]
        if s is None:
            raise KeyError(f"output {i} of a rolled node is not kept")
        return program.Row(s, self.k)


def _row(env, node, i):
    """Output ``i`` of ``node`` for stacking: a ``program.Row`` of an earlier loop's stack
    (sliced only if needed), or the value."""
    v = env[id(node)]
    return v.row(i) if type(v) is _Rows and i not in v.cache else v[i]


def _run(body, carry0, xs, n, reverse, n_ws):
    """The loop: ``body(carry, x) -> (carry, ys, (flags, values))`` run ``n`` times over the
    rows of ``xs`` (last row first when ``reverse``), traced once (into a jaxpr the loop's step
    evaluates). Returns ``ys`` stacked and each check's (any flag, value at the first iteration
    that failed), kept in the loop's state. The first ``n_ws`` stacks are written into the
    program's workspace (its last arguments, kept from the run before: ``WorkspaceCall``), so
    nothing fills them first; any other starts as ``STACK_BUFFERS`` says: uninitialized, or a
    fill of distinct values (scan's one shared fill of zeros per shape was copied into each
    buffer)."""
    x0 = tuple(jax.ShapeDtypeStruct(a.shape[1:], a.dtype) for a in xs)
    c0 = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in carry0)
    traced, (_, ys, (flags, _)) = jax.make_jaxpr(body, return_shape=True)(c0, x0)
    given = program.take_workspace(n_ws)
    empty = stack_buffers(program.platform()) == "empty"
    bufs = tuple(given) + tuple(jax.lax.empty((n,) + o.shape, o.dtype) if empty else
                                jnp.full((n,) + o.shape, k + 1, o.dtype) for k, o in enumerate(ys[len(given):]))
    nc, ny, nk = len(carry0), len(ys), len(flags)
    bad0 = (tuple(jnp.zeros((), jnp.bool_) for _ in range(nk)), tuple(jnp.zeros((), program.row_dtype()) for _ in range(nk)))

    def step(i, state):
        carry, bufs, (bad, first) = state
        at = n - 1 - i if reverse else i
        # (not lax's *_index_in_dim: jitted wrappers, a trace of their own per shape, ~0.5 ms each)
        x = tuple(jax.lax.squeeze(jax.lax.dynamic_slice_in_dim(a, at, 1, 0), (0,)) for a in xs)
        out = jax.core.eval_jaxpr(traced.jaxpr, traced.consts, *carry, *x)
        carry, y, f, v = out[:nc], out[nc:nc + ny], out[nc + ny:nc + ny + nk], out[nc + ny + nk:]
        first = tuple(jnp.where(b, w, u) for b, w, u in zip(bad, first, v))
        bad = tuple(b | g for b, g in zip(bad, f))
        bufs = tuple(jax.lax.dynamic_update_slice_in_dim(b, r[None], at, 0) for b, r in zip(bufs, y))
        return tuple(carry), bufs, (bad, first)

    _, bufs, (bad, first) = jax.lax.fori_loop(0, n, step, (tuple(carry0), bufs, bad0))
    program.give_workspace(bufs[:len(given)])
    return bufs, bad, first


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
    runs = {s: program.row_run([_row(env, n, i) for n, i in v])
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
                xs.append(r[0] if r is not None else program.stack_rows([_row(env, n, i) for n, i in v[::-1]]))
            else:
                xs.append(program.stack_rows([_row(env, n, i) for n, i in v]))
    types = [(a.dtype, a.shape) for a in carry0]
    found = []  # the checks reported inside the body: (op, where, text, kind)

    def body(carry, x):
        vals = [None] * len(roles)
        with program.loop_checks() as checks:
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
        found[:] = [c[2:] for c in checks]
        ys = tuple(vals[j][i] for j, i in outputs)
        flags = tuple(c[0] for c in checks)
        values = tuple(jnp.asarray(c[1]).astype(program.row_dtype()) for c in checks)
        out = _as_carry(vals[out_role], metas) + tuple(vals[r][i] for r, i in nexts)
        out = tuple(jax.lax.convert_element_type(o, t) for o, (t, _) in zip(out, types))
        return out, ys, (flags, values)

    ys, bad, first = _run(body, carry0, tuple(xs), len(loop.iters), reverse, len(outputs))
    for info, f, v in zip(found, bad, first):
        program.add_check(f, v, info)
    width = {}
    for (j, i), y in zip(outputs, ys):
        width.setdefault(j, {})[i] = y
    for j, per in width.items():
        stacks = [per.get(i) for i in range(len(roles[j].sig.outs))]
        last = len(loop.iters) - 1
        for k, it in enumerate(loop.iters):
            env[id(it[j])] = _Rows(stacks, last - k if reverse else k)
