"""Scan: a loop over the leading dimension as one XLA loop, its body traced and compiled once.

``scan(fn, init, xs)`` computes what the Python loop ``carry = init; for x in xs: carry, y =
fn(carry, x)`` computes, returning the last carry and the ``y`` of every iteration stacked
(torch_xla's ``torch_xla.experimental.scan``; JAX's ``lax.scan``). ``scan_layers(layers,
input_data)`` runs identical modules one after another as one such loop over their stacked
parameters (torch_xla's ``scan_layers``). The program's size, and so its compile time, no
longer grows with the number of iterations or layers.

How: ``fn`` is called once, on placeholders for one iteration's carry and ``x`` (no_grad), and
the IR it records is copied out as the loop's body (``capture._copy``: inputs become numbered
placeholders, device data met on the way becomes parameters), hashed once from the copied
roots. Each call records one ``lazyxla::scan`` node whose lowering is ``jax.lax.scan`` over
the body's JAX function, inside whatever program the step becomes. Tensors ``fn`` uses from
outside (weights it closes over, seen as the arguments of its torch calls) are inputs of the
loop too, and get their gradients. Autograd: a ``torch.autograd.Function`` whose backward
records ``lazyxla::scan_vjp``, lowered to ``jax.vjp`` of the same loop (JAX transposes the
loop: one backward body, whatever the length; the forward loop is computed again inside it).
Random ops draw a new seed every iteration, threaded through the loop as the Python loop
threads it. Refused with the user's line: a value read inside ``fn`` (the body is traced once),
a carry whose shape or dtype changes, an in-place write to a tensor from outside the loop.

May touch: the RNG chain (its seed goes through the loop), the tensors it makes; reads the
executor's read guard while tracing.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

from ..engine import executor
from .. import metrics
from ..ir import rng
from .region import _copy, _input_sig
from ..frontend.device import DEVICE
from ..errors import LazyXlaError
from ..hashing import fold
from ..ir.node import Node, OpSig, Slot, TensorMeta
from ..ir.user_line import fmt_where, resolve_site, user_frame, user_site
from ..lowering import build_program
from ..lowering import program as _program
from ..run.storage import fresh, scalar_value
from ..frontend.tensor import LazyTensor, _tensor

SCAN_OP = "lazyxla::scan"
SCAN_VJP_OP = "lazyxla::scan_vjp"
UNSTACK_OP = "lazyxla::unstack"


class Body:
    """One traced body: its JAX function (``program``) and the loop's layout: operands (carry,
    xs, closures, [seed], constants; ``in_metas``), outputs (carry, stacked ys, [seed]), the
    differentiable operands (``diff``) and outputs (``float_outs``). Hashed, inside the nodes'
    signatures, as the fold of its copied roots' hashes (``hash``)."""

    def __lazyxla_encode__(self):
        return b"S" + self.hash

    def __repr__(self):
        return f"scan({self.name})#{self.hash.hex()[:8]}"

    def loop(self, vals, report=True):
        """``jax.lax.scan`` of the body over the operands: (carry..., ys..., [seed]). The body's
        value checks are reported once for the whole loop (any iteration's), unless ``report``
        is false (the backward's loop: the forward node reports them)."""
        nc, nx, ny = self.n_carry, self.n_x, len(self.y_metas)
        carry0, xs = tuple(vals[:nc]), tuple(vals[nc:nc + nx])
        rest = tuple(vals[nc + nx:])  # closures, [seed], constants
        k = self.n_closure
        closures, seed0, consts = rest[:k], rest[k:k + self.random], rest[k + self.random:]
        infos = []  # (op, where, text, kind) of each check, in the order of the rows

        def step(c, x):
            with _program.loop_checks(report) as checks:  # the body's own, per iteration
                out = self.program(*c[:nc], *x, *closures, *c[nc:], *consts)
            infos[:] = [tuple(ck[2:]) for ck in checks]
            rd = _program.row_dtype()
            rows = tuple(jnp.stack([f.astype(rd), v.astype(rd)]) for f, v, *_ in checks)
            return tuple(out[:nc]) + tuple(out[nc + ny:]), (tuple(out[nc:nc + ny]), rows)

        c, (ys, rows) = jax.lax.scan(step, carry0 + seed0, xs)
        for flag_value, info in zip(rows, infos):
            flags = flag_value[:, 0] != 0
            _program.add_check(jnp.any(flags), flag_value[jnp.argmax(flags), 1], info)
        return tuple(c[:nc]) + tuple(ys) + tuple(c[nc:])


def _lower_scan(sig, body, *vals):
    return body.loop(vals)


def _lower_scan_vjp(sig, body, *vals):
    n_in = len(body.in_metas)
    prim, cots = list(vals[:n_in]), vals[n_in:]

    def forward(*d):
        full = list(prim)
        for i, v in zip(body.diff, d):
            full[i] = v
        outs = body.loop(full, report=False)
        return tuple(outs[i] for i in body.float_outs)

    _, vjp = jax.vjp(forward, *[prim[i] for i in body.diff])
    return tuple(vjp(tuple(cots)))


# ---------------------------------------------------------------------------------------
class _Closures(TorchFunctionMode):
    """While ``fn`` is traced: the lazy tensors its torch calls take that it did not make (the
    weights and other tensors it closes over), in order of first use."""

    def __init__(self, inputs):
        super().__init__()
        self.made = {id(t) for t in inputs}
        self.keep = list(inputs)  # every tensor counted in ``made``, alive: ids are not reused
        self.found = []
        self.versions = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        for a in pytree.tree_leaves((args, kwargs or {})):
            if type(a) is LazyTensor and id(a) not in self.made:
                self.made.add(id(a))
                self.keep.append(a)
                self.found.append(a)
                st = a._state.storage
                self.versions.append((st.version, st.ir, st.data))
        out = func(*args, **(kwargs or {}))
        for o in pytree.tree_leaves(out):
            if type(o) is LazyTensor and id(o) not in self.made:
                self.made.add(id(o))
                self.keep.append(o)
        return out


def _placeholder(k, meta):
    """A lazy tensor standing for one iteration's input ``k`` while the body is traced."""
    return _tensor(fresh((Node(_input_sig(k, meta), ()), 0), meta))


def _at(site) -> str:
    return fmt_where(resolve_site(site) if site is not None else None)


def _is_float(meta) -> bool:
    return meta.dtype.is_floating_point or meta.dtype.is_complex


def _check_leaves(leaves, what, where):
    for t in leaves:
        if type(t) is not LazyTensor:
            got = f"a tensor on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise LazyXlaError(f"lazyxla.scan: every leaf of {what} must be a tensor on {DEVICE}, got {got} "
                               f"(at {_at(where)})")


def _trace(fn, flat_init, init_spec, flat_xs, xs_spec, where, name):
    """The body of ``fn`` (a ``Body``) and the tensors it closes over, in operand order."""
    nc, nx = len(flat_init), len(flat_xs)
    metas_c = [t._state.meta for t in flat_init]
    metas_x = [_slice_meta(t._state.meta) for t in flat_xs]
    carry_in = [_placeholder(k, m) for k, m in enumerate(metas_c)]
    x_in = [_placeholder(nc + k, m) for k, m in enumerate(metas_x)]

    def refuse():
        raise LazyXlaError(f"lazyxla.scan: {name} reads a value on the host (or runs an op without a lowering on "
                           f"the CPU) at {fmt_where(user_frame(3))}: the body of a loop is traced once, for "
                           f"every iteration, and cannot depend on values; compute it on the device")

    seed0 = rng.current()
    guard = executor.set_read_guard(refuse)
    mode = _Closures(carry_in + x_in)
    born = [t._state.storage.version for t in carry_in + x_in]
    written = []
    try:
        with torch.no_grad(), mode:
            out = fn(pytree.tree_unflatten(carry_in, init_spec), pytree.tree_unflatten(x_in, xs_spec))
    finally:
        executor.set_read_guard(guard)
        seed1 = rng.current()
        rng.set_current(seed0)  # each call draws its numbers through the scan node
        for t, (version, ir, data) in zip(mode.found, mode.versions):
            st = t._state.storage
            if st.version != version:  # written by the trace: its value from before, and refused below
                st.restore(ir, data)
                written.append(t)
    for k, (t, v) in enumerate(zip(carry_in + x_in, born)):
        if t._state.storage.version != v:
            what = f"carry leaf {k}" if k < nc else f"xs leaf {k - nc}"
            raise LazyXlaError(f"lazyxla.scan: {name} writes in place to its input ({what}, {list(t.shape)}) (scan at "
                               f"{_at(where)}): the write would not leave the loop; return the new value instead "
                               f"(in scan_layers: a layer that updates its buffers, such as BatchNorm's running "
                               f"statistics in training mode)")
    if written:
        t = written[0]
        raise LazyXlaError(f"lazyxla.scan: {name} writes in place to a tensor from outside the loop "
                           f"({list(t.shape)}, {t.dtype}) (scan at {_at(where)}): a loop's body may only "
                           f"return new values; return it in the carry instead")
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise LazyXlaError(f"lazyxla.scan: {name} must return (carry, y), got {type(out).__name__} "
                           f"(scan at {_at(where)})")
    carry_out, ys = out
    flat_c, spec_c = pytree.tree_flatten(carry_out)
    if spec_c != init_spec:
        raise LazyXlaError(f"lazyxla.scan: {name} returns a carry of structure {spec_c}, but init is {init_spec} "
                           f"(scan at {_at(where)})")
    _check_leaves(flat_c, "the carry fn returns", where)
    for k, (t, m) in enumerate(zip(flat_c, metas_c)):
        if tuple(t.shape) != tuple(m.shape) or t.dtype != m.dtype:
            raise LazyXlaError(f"lazyxla.scan: {name} changes carry leaf {k} from {list(m.shape)} {m.dtype} to "
                               f"{list(t.shape)} {t.dtype} (scan at {_at(where)}): a loop's carry keeps its "
                               f"shape and dtype")
    leaves_y, spec_y = pytree.tree_flatten(ys)
    flat_y = [t for t in leaves_y if t is not None]  # None: no output there
    _check_leaves(flat_y, "the y fn returns", where)
    closures = list(mode.found)
    random = seed1 is not seed0
    seed_meta = [seed0[0].sig.outs[seed0[1]]] if random else []
    closure_metas = [t._state.meta for t in closures]
    inputs = [t._state.value() for t in carry_in + x_in + closures] + ([seed0] if random else [])
    roots = [t._state.value() for t in flat_c + flat_y] + ([seed1] if random else [])
    placeholders, post, croots, consts = _copy(inputs, metas_c + metas_x + closure_metas + seed_meta, roots)
    b = Body()
    b.name = name
    b.n_carry, b.n_x, b.n_closure, b.random = nc, nx, len(closures), int(random)
    b.consts = tuple(consts)
    b.y_metas = [t._state.meta for t in flat_y]
    b.hash = fold(b"scan", bytes([nc % 256, nx % 256]), *[r.vh[i] for r, i in croots])
    b.roots = tuple(croots)  # the body's IR, for explanations (``debug.explain``)
    b.program = build_program(placeholders + post, croots, placeholders, checked=False)
    # the node's operands: the carry, xs (whole), closures, [seed], constants
    b.in_metas = metas_c + [t._state.meta for t in flat_xs] + closure_metas + seed_meta + \
        [o.sig.outs[i] for o, i in consts]
    outs = metas_c + [_stacked_meta(m, flat_xs[0].shape[0]) for m in b.y_metas]
    n_ops = len(b.in_metas)
    b.sig = OpSig(SCAN_OP, None, _lower_scan, ((b,) + tuple(Slot(i) for i in range(n_ops)), ()), outs + seed_meta)
    b.diff = tuple(i for i, m in enumerate(b.in_metas[:nc + nx + len(closures)]) if _is_float(m))
    b.float_outs = tuple(i for i, m in enumerate(outs) if _is_float(m))
    b.vjp_sig = OpSig(SCAN_VJP_OP, None, _lower_scan_vjp,
                      ((b,) + tuple(Slot(i) for i in range(n_ops + len(b.float_outs))), ()),
                      [b.in_metas[i] for i in b.diff])
    b.spec_y = spec_y
    b.y_slots = [t is not None for t in leaves_y]
    return b, closures


def _slice_meta(meta):
    return TensorMeta(tuple(meta.shape[1:]), meta.dtype)


def _stacked_meta(meta, n):
    return TensorMeta((n,) + tuple(meta.shape), meta.dtype)


# ---------------------------------------------------------------------------------------
# The call: one node forward, one node backward.
class _ScanCall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, body, where, *tensors):
        vals = [t._state.value() for t in tensors]
        if body.random:
            vals.append(rng.current())
        vals.extend(body.consts)
        node = Node(body.sig, tuple(vals), where)
        outs = body.sig.outs
        n = body.n_carry + len(body.y_metas)
        result = tuple(_tensor(fresh((node, j), outs[j])) for j in range(n))
        if body.random:
            rng.set_current((node, n))
        ctx.body, ctx.vals, ctx.where = body, tuple(vals), where
        ctx.mark_non_differentiable(*[r for j, r in enumerate(result) if j not in body.float_outs])
        metrics.counter_inc("ScanCall")
        return result

    @staticmethod
    def backward(ctx, *grads):
        body = ctx.body
        outs = body.sig.outs
        cots = []
        for j in body.float_outs:
            g = grads[j]
            if g is None:
                g = torch.zeros(outs[j].shape, dtype=outs[j].dtype, device=DEVICE)
            cots.append(g._state.value())
        node = Node(body.vjp_sig, ctx.vals + tuple(cots), ctx.where)
        n_in = body.n_carry + body.n_x + body.n_closure
        got = [None] * n_in
        for k, i in enumerate(body.diff):
            got[i] = _tensor(fresh((node, k), body.vjp_sig.outs[k]))
        return (None, None) + tuple(got)


def _lower_unstack(sig, x, *index):
    out = tuple(jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=False) for i in index)
    for k, v in enumerate(out):  # (the indices hold 0..n-1): a stack of these is x again
        _program.note_row(v, x, k)
    return out


@functools.lru_cache(maxsize=256)
def _unstack_sig(n, meta):
    """The ``lazyxla::unstack`` signature for ``n`` slices of ``meta``, made (and hashed) once
    per (n, meta): every training step's backward takes it."""
    return OpSig(UNSTACK_OP, None, _lower_unstack, (tuple(Slot(i) for i in range(n + 1)), ()), [meta] * n)


class _StackLayers(torch.autograd.Function):
    """``torch.stack`` of the layers' parameters, whose backward hands each layer its slice of
    the stacked gradient through one ``lazyxla::unstack`` node. Its indices are device data
    (int32 scalars, cached by value), not constants: XLA:CPU compiles every distinct kernel
    on its own (about 20 ms each here) and compiles identical ones once, so slices at constant
    offsets, one distinct kernel per layer and parameter (each with the optimizer's update of
    that parameter fused in), made the compile grow with depth; slices at runtime offsets are
    one kernel whatever the depth."""

    @staticmethod
    def forward(ctx, where, *ts):
        ctx.meta, ctx.where = TensorMeta(tuple(ts[0].shape), ts[0].dtype), where
        return torch.stack(ts)

    @staticmethod
    def backward(ctx, g):
        n = g.shape[0]
        index = tuple(scalar_value(i, torch.int32) for i in range(n))  # cached by value (dropped under SPMD)
        node = Node(_unstack_sig(n, ctx.meta), (g._state.value(),) + index, ctx.where)
        return (None,) + tuple(_tensor(fresh((node, i), ctx.meta)) for i in range(n))


# ---------------------------------------------------------------------------------------
# The API (torch_xla.experimental's names and semantics).
def scan(fn, init, xs):
    """``carry = init; for x in xs: carry, y = fn(carry, x)`` as one XLA loop: returns the last
    carry and every iteration's ``y`` stacked along a new leading dimension. ``init``, ``xs``,
    the carry and ``y`` are pytrees of tensors on the lazy device; every leaf of ``xs`` has the
    same leading size (the number of iterations). Gradients reach ``init``, ``xs`` and the
    tensors ``fn`` uses from outside (its weights)."""
    where = user_site(2)
    if not callable(fn):
        raise ValueError(f"lazyxla.scan: fn must be callable, got {type(fn).__name__}")
    flat_init, init_spec = pytree.tree_flatten(init)
    flat_xs, xs_spec = pytree.tree_flatten(xs)
    if not flat_xs:
        raise ValueError("lazyxla.scan: xs is empty: it must hold at least one tensor to loop over")
    _check_leaves(flat_init, "init", where)
    _check_leaves(flat_xs, "xs", where)
    lengths = {t.shape[0] if t.dim() else None for t in flat_xs}
    if len(lengths) != 1 or None in lengths:
        raise ValueError(f"lazyxla.scan: every leaf of xs must have the same leading size (the number of "
                         f"iterations); got {sorted(str(n) for n in lengths)}")
    if 0 in lengths:
        raise ValueError("lazyxla.scan: xs has no iterations (leading size 0)")
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    body, closures = _trace(fn, flat_init, init_spec, flat_xs, xs_spec, where, name)
    outs = _ScanCall.apply(body, where, *flat_init, *flat_xs, *closures)
    nc = body.n_carry
    ys = iter(outs[nc:])
    return (pytree.tree_unflatten(list(outs[:nc]), init_spec),
            pytree.tree_unflatten([next(ys) if slot else None for slot in body.y_slots], body.spec_y))


def scan_layers(layers, input_data):
    """``for layer in layers: input_data = layer(input_data)`` as one XLA loop over the layers'
    stacked parameters and buffers (the layers must be alike: the same names, shapes and
    dtypes). Returns the last layer's output. Each layer's parameters get their gradients
    (through the stack)."""
    where = user_site(2)
    layers = list(layers)
    if not layers:
        return input_data
    first = layers[0]
    names_p = [n for n, _ in first.named_parameters()]
    names_b = [n for n, _ in first.named_buffers()]
    stacked = {}
    for kind, names, get in (("parameters", names_p, lambda m: dict(m.named_parameters())),
                             ("buffers", names_b, lambda m: dict(m.named_buffers()))):
        per_layer = [get(m) for m in layers]
        for i, d in enumerate(per_layer):
            if sorted(d) != sorted(names):
                raise ValueError(f"lazyxla.scan_layers: layer {i} has mismatched keys in its {kind}: "
                                 f"{sorted(set(d) ^ set(names))} (every layer must be like layer 0)")
        for n in names:
            ts = [d[n] for d in per_layer]
            for i, t in enumerate(ts):
                if t.shape != ts[0].shape or t.dtype != ts[0].dtype:
                    raise ValueError(f"lazyxla.scan_layers: Shape mismatch: {n} of layer {i} is {list(t.shape)} "
                                     f"{t.dtype}, layer 0's {list(ts[0].shape)} {ts[0].dtype}")
            stacked[n] = _StackLayers.apply(where, *ts)

    def one_layer(carry, params):
        return torch.func.functional_call(first, params, (carry,)), None

    one_layer.__qualname__ = f"scan_layers({type(first).__name__})"
    carry, _ = scan(one_layer, input_data, stacked)
    return carry
