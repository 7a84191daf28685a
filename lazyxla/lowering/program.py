"""The program: a post-order of IR nodes as one JAX function, and the lowerings of the
nodes lazyxla records itself.

Value checks (``LAZYXLA_CHECK_VALUES``, on by default): what only the values can tell (an index
out of bounds, a probability that is negative or NaN) is computed inside the program. A lowering
calls ``check_index`` or ``report`` while it is traced; a checked program (``build_program``'s
default) returns one more output, an int64 array of one (flag, value) row per check, and lists
the checks, in that order, as its function's ``checks`` attribute: (op, user line, message with
``{value}``, error kind). ``execution`` reads the rows when the program completes.

``lower_call`` evaluates one signature's registered lowering (``sig.lower``) on JAX values:
it instantiates the call's template, runs 0-d operands of ``ZERO_D_AS_VECTOR`` ops as
1-element vectors, casts results to PyTorch's output dtypes and broadcasts them where
PyTorch broadcasts. ``build_program`` chains the nodes of a post-order into one function of
the parameters, which ``executor`` hands to ``jax.jit``. ``lower_convert`` and
``lower_view_scatter`` lower the warm path's own ``lazyxla::convert`` and ``lazyxla::view_scatter``
nodes, ``lower_sharding`` a sharding annotation (``xla::sharding``).

While a program is traced it holds one trace state (``_Trace``): the rolled loops' workspace
arguments and final buffers, the rows of their stacked outputs (``stack_rows`` reads runs of
them as slices), and its row-index arguments (``read_row``); ``loop_checks`` collects a loop
body's value checks apart.

May touch: its own trace state while a program is traced; reads the registries.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..config import env_flag
from ..ir.node import Node, OpSig, Slot, TensorMeta
from ..xla import widths
from ..xla.client import jax_device, jnp_dtype
from .registry import ZERO_D_AS_VECTOR


# ---------------------------------------------------------------------------------------
# The program: post-order -> one JAX function of the parameters.
def instantiate(x, vals):
    t = type(x)
    if t is Slot:
        return vals[x.i]
    if t is tuple:
        return tuple(instantiate(y, vals) for y in x)
    return x


def lower_node(node, vals):
    """Evaluate one node on JAX values (inside a trace), its ops named for the node's op and the
    user's line that recorded it (``scope_name``: in every op's ``op_name`` metadata, which
    profiles read back, ``debug.profile``)."""
    with jax.named_scope(scope_name(node)):
        try:
            return lower_call(node.sig, vals)
        except OverflowError as e:  # a constant of the op that the device's integers cannot hold
            w = node.where
            at = f" at {os.path.basename(w[0])}:{w[1]}" if w else ""
            raise OverflowError(f"{node.sig.op}{at}: {e}" + (
                f"; {widths.range_text('an int64 constant is')}" if widths.narrow() else "")) from None


_SCOPES: dict = {}  # (op, user line) -> scope name


def scope_name(node) -> str:
    """``aten.mm at train.py:42``: the node's op and the user's line (file and line) that recorded
    it; the op alone where no user line is known. Lines are the recording's that compiled the
    program: an identical graph recorded from other lines later finds that program (lines are
    not part of a key)."""
    w = node.where
    k = (node.sig.op, w)
    s = _SCOPES.get(k)
    if s is None:
        op = node.sig.op.replace("::", ".").replace("/", "_")
        s = _SCOPES[k] = f"{op} at {os.path.basename(w[0])}:{w[1]}" if w else op
        if len(_SCOPES) >= 1 << 16:
            _SCOPES.clear()
    return s


def lower_call(sig, vals):
    """Evaluate a signature's lowering on operand values (JAX arrays or abstract values).
    Results are cast to PyTorch's output dtypes and broadcast where PyTorch broadcasts; a
    shape that cannot be PyTorch's is an error, never silently reshaped."""
    if all(0 in m.shape for m in sig.outs):
        # nothing to compute (and some JAX reductions refuse zero-size inputs)
        return tuple(jnp.zeros(m.shape, jnp_dtype(m.dtype)) for m in sig.outs)
    targs, tkw = sig.template
    args = instantiate(targs, vals)
    kwargs = {k: instantiate(v, vals) for k, v in tkw}
    as_vector = ZERO_D_AS_VECTOR.get(sig.func)
    if as_vector and getattr(args[0], "ndim", None) == 0:
        args = _as_vectors(args, as_vector)
    out = sig.lower(sig, *args, **kwargs)
    if not isinstance(out, (tuple, list)):
        out = (out,)
    if as_vector and len(out) == len(sig.outs):
        out = [jnp.reshape(o, m.shape) for o, m in zip(out, sig.outs)]
    res = []
    for o, m in zip(out, sig.outs):
        o = jnp.asarray(o)
        want = jnp_dtype(m.dtype)
        if o.dtype != want:
            if o.dtype == jnp.int64 and want == jnp.int32 and m.dtype is torch.int64 and _checks is not None:
                # int64 held in 32 bits (``xla.widths``), computed wider by the lowering: it must fit
                bad = (o < widths.INT32_MIN) | (o > widths.INT32_MAX)
                report(jnp.any(bad), jnp.sum(bad, dtype=jnp.int32), WRAP_TEXT)
            o = o.astype(want)
        if tuple(o.shape) != m.shape:
            if not _broadcastable(o.shape, m.shape):
                raise ValueError(f"the lowering of {sig.op} gives shape {list(o.shape)} where PyTorch gives "
                                 f"{list(m.shape)}")
            o = jnp.broadcast_to(o, m.shape)
        res.append(o)
    if len(res) != len(sig.outs):
        raise ValueError(f"the lowering of {sig.op} gives {len(res)} outputs where PyTorch gives {len(sig.outs)}")
    if _checks is not None and sig.op in widths.WRAPS and widths.narrow():
        check_wrap(sig, args, kwargs, res)
    return tuple(res)


def _as_vectors(args, which):
    """0-d operands as shape (1,): the input, and for "index"/"all" the index (argument 2)
    and for "all" the source (argument 3)."""
    picks = {0} | ({2} if which in ("index", "all") else set()) | ({3} if which == "all" else set())
    return tuple(a.reshape(1) if i in picks and getattr(a, "ndim", None) == 0 else a
                 for i, a in enumerate(args))


def _broadcastable(src, dst):
    if len(src) > len(dst):
        return False
    for a, b in zip(reversed(src), reversed(dst)):
        if a != b and a != 1:
            return False
    return True


def build_program(post, roots, params, checked=True, workspace=0, row_args=0):
    """A function ``f(*param_arrays) -> tuple(root arrays)`` evaluating the graph; ``params``
    (device-data leaves, or a captured region's placeholders) are its arguments, in order.
    ``checked``: the value checks its lowerings report are one more output (see the module's
    docstring; ``f.checks`` lists them once it was traced); a region's function (not checked)
    reports into the program that calls it. ``workspace``: how many more arguments, after the
    parameters, are buffers the rolled loops write their stacked outputs into (``rolled``);
    their final values are outputs after the roots. ``row_args``: how many more arguments, after
    those, are the row indices 0, 1, ... (``row_args``, ``read_row``)."""
    is_param = {id(p) for p in params}
    ops = [n for n in post if id(n) not in is_param]

    def program(*arrays):
        global _checks, _node, _trace
        outer, was, was_trace = _checks, _node, _trace
        if checked and outer is None and CHECK_VALUES:
            _checks = []
        mine = _checks is not outer
        if was_trace is None:  # the outermost program of this trace (a region's runs inside it)
            n = len(params) + workspace
            _trace = _Trace(arrays[len(params):n], arrays[n:n + row_args])
        try:
            env = {id(p): (a,) for p, a in zip(params, arrays)}
            for n in ops:
                if type(n) is not Node:  # a rolled loop (``rolling``)
                    n.lower_into(env)
                    continue
                vals = [env[id(o)][i] for o, i in n.operands]
                _node = n
                env[id(n)] = lower_node(n, vals)
            out = tuple(env[id(r)][i] for r, i in roots)
            if was_trace is None:
                out = out + tuple(_trace.workspace_out)
            if mine:
                program.checks = tuple((op, where, text, kind) for _, _, op, where, text, kind in _checks)
                if _checks:
                    rd = row_dtype()
                    rows = [jnp.stack([flag.astype(rd), value.astype(rd)])
                            for flag, value, *_ in _checks]
                    out = out + (jnp.stack(rows),)
            return out
        finally:
            _node, _trace = was, was_trace
            if mine:
                _checks = outer

    program.checks = ()
    return program


class _Trace:
    """What the rolled loops of one program being traced share with it: its workspace
    arguments not yet taken, the loops' final buffers (outputs after the roots), and the rows
    of the loops' stacked outputs (``note_row``)."""

    __slots__ = ("workspace", "workspace_out", "rows", "row_index")

    def __init__(self, workspace, row_index=()):
        self.workspace = list(workspace)
        self.workspace_out = []
        self.rows = {}  # id(array) -> (array, stack, row)
        self.row_index = row_index  # the row-index arguments: row k's index is row_index[k]


_trace = None  # the outermost program being traced, or None


def platform() -> str:
    """The platform programs are lowered for: JAX's device's (``"cpu"``, ``"tpu"``, ``"gpu"``)."""
    return jax_device().platform


def take_workspace(k):
    """The next ``k`` (at most) of the program's workspace arguments (``rolled``)."""
    got = _trace.workspace[:k]
    del _trace.workspace[:k]
    return got


def give_workspace(bufs):
    """A loop's final workspace buffers: outputs of the program after its roots."""
    _trace.workspace_out.extend(bufs)


# ---------------------------------------------------------------------------------------
# Rows of a rolled loop's stacked outputs (``rolled``): a lowering that stacks values (the
# optimizer's step stacking a group's gradients, a loop stacking its per-iteration inputs) takes
# runs of rows as slices of the loop's stack, never as a stack of per-row slices (one kernel
# per row: XLA:CPU compiles each slice at another offset as a kernel of its own).
def note_row(array, stack, k):
    if _trace is not None:  # (a lowering also runs for shapes alone, outside any program)
        _trace.rows[id(array)] = (array, stack, k)


# Rows of device data read outside the loops (``select(data, 0, k)``: a parameter kept as a row
# of a stack, ``param_stacks``, in a model whose layers did not roll) take their index from an
# argument holding k, never a constant: XLA fuses a constant row into every kernel reading it, so
# each layer's kernels were kernels of their own (a 20-layer GPT-2 that did not roll compiled
# 417 distinct kernels against 149 with separate parameters, 9.2-10.8 s of XLA against 4.8-6.2;
# with the index as an argument 154 kernels, 3.9 s against 4.0 s).
ROW_ARGS_MAX = 1024  # data with more rows (a table, a batch) keeps constant rows


def selects_data(x) -> bool:
    """Whether node ``x`` selects from device data (``select(data, dim, index)``): a row of a
    stacked parameter, read in a loop (``rolling``) or outside one (``read_row``)."""
    return x.sig.op == "aten::select.int" and x.operands[0][0].data is not None


def row_args(post) -> int:
    """How many row-index arguments a program of this post-order takes: one past the largest
    row of device data (of at most ``ROW_ARGS_MAX`` rows) that a node selects."""
    n = 0
    for x in post:
        if type(x) is not Node or not selects_data(x):
            continue
        targs = x.sig.template[0]  # (x, dim, index); a dynamic program's index may be a symbol
        shape = x.operands[0][0].sig.outs[0].shape
        if len(targs) == 3 and type(targs[1]) is int and type(targs[2]) is int and shape \
                and 1 < shape[0] <= ROW_ARGS_MAX and targs[1] % len(shape) == 0:
            n = max(n, targs[2] % shape[0] + 1)
    return n


def read_row(x, k):
    """Row ``k`` of ``x`` (noted for ``stack_rows``): at the program's row-index argument when
    the node being lowered reads it from device data and the program has one, else at a constant."""
    t, n = _trace, _node
    if t is not None and k < len(t.row_index) and n is not None and selects_data(n):
        v = jax.lax.dynamic_index_in_dim(x, t.row_index[k], 0, keepdims=False)
    else:
        v = jax.lax.index_in_dim(x, k, 0, keepdims=False)
    note_row(v, x, k)
    return v


class Row:
    """Row ``k`` of a loop's stack, not sliced yet: ``stack_rows`` and ``row_run`` take it as
    that row and slice it only where a value is needed (a loop reading another's stack whole
    slices nothing)."""

    __slots__ = ("stack", "k")

    def __init__(self, stack, k):
        self.stack, self.k = stack, k

    def value(self):
        v = jax.lax.index_in_dim(self.stack, self.k, 0, keepdims=False)
        note_row(v, self.stack, self.k)
        return v


def _value(v):
    return v.value() if type(v) is Row else v


def _row_info(values):
    """Per value: (stack, row) when it is a row of a loop's stack (a ``Row``, or ``note_row``),
    else None."""
    rows = _trace.rows if _trace is not None else {}
    info = []
    for v in values:
        if type(v) is Row:
            info.append((v.stack, v.k))
            continue
        r = rows.get(id(v))
        info.append((r[1], r[2]) if r is not None and r[0] is v else None)
    return info


def row_run(values):
    """(stack, 1) when ``values`` are every row of one stack in order, (stack, -1) when in
    reverse order, else None."""
    info = _row_info(values)
    if info[0] is None or _periods(info, 0, 1) != len(values) or len(values) != info[0][0].shape[0]:
        return None
    return info[0][0], (1 if info[0][1] == 0 else -1)


_PERIODS = 32  # the most stacks whose rows one run interleaves (a BERT layer has 9 vectors of its width)


def stack_rows(values):
    """``jnp.stack(values)`` (a value may be a ``Row``), reading runs of rows of stacks as slices of them: rows of one stack
    at a fixed stride (in order, reversed, or every ``d``-th: a layer's parameter among a stack of
    parameters, ``param_stacks``), or of ``p`` stacks taken in turn (a group of parameters in a
    model's order: each layer's q, k, v and o weights, each role a stack of the loop),
    interleaved in one kernel."""
    info = _row_info(values)
    if all(x is None for x in info):
        return jnp.stack([_value(v) for v in values])
    parts, i = [], 0
    while i < len(values):
        m, p = (0, 1) if info[i] is None else \
            max(((_periods(info, i, p), p) for p in range(1, _PERIODS + 1)), key=lambda mp: (mp[0] * mp[1], -mp[1]))
        if m < 2:
            parts.append(_value(values[i])[None])
            i += 1
            continue
        cols = []
        for j in range(p):
            st, a = info[i + j]
            d = info[i + j + p][1] - a
            b = a + (m - 1) * d
            lo, hi = min(a, b), max(a, b)
            col = st if (lo, hi, abs(d)) == (0, st.shape[0] - 1, 1) else st[lo:hi + 1:abs(d)]
            cols.append(col if d > 0 else jnp.flip(col, 0))
        parts.append(cols[0] if p == 1 else jnp.stack(cols, 1).reshape((m * p,) + tuple(cols[0].shape[1:])))
        i += m * p
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts)


def _periods(info, i, p):
    """How many times the ``p`` rows from ``info[i]`` on repeat, each a fixed number of rows on
    (or back) in the same stack as ``p`` places before (0: not ``p`` rows there)."""
    first = info[i:i + p]
    if len(first) < p or None in first:
        return 0
    second = info[i + p:i + 2 * p]
    if len(second) < p or any(x is None or x[0] is not f[0] or x[1] == f[1] for x, f in zip(second, first)):
        return 1
    steps = [x[1] - f[1] for x, f in zip(second, first)]
    m = 2
    while i + (m + 1) * p <= len(info) and all(
            x is not None and x[0] is f[0] and x[1] == f[1] + m * d
            for x, f, d in zip(info[i + m * p:i + (m + 1) * p], first, steps)):
        m += 1
    return m


# ---------------------------------------------------------------------------------------
# Value checks: reported by lowerings while a checked program is traced. A program's rows of
# (flag, value) are int64 as the device holds it (int32 on a TPU: ``xla.widths``).
CHECK_VALUES = env_flag("LAZYXLA_CHECK_VALUES", True)
_checks = None  # the reports of the checked program being traced, or None
_node = None    # the node being lowered


def row_dtype():
    """The dtype of a program's rows of (flag, value): int64 as the device holds it."""
    return jnp_dtype(torch.int64)


def report(flag, value, text, kind="RuntimeError"):
    """A value check of the node being lowered: ``flag`` (a bool scalar) is true when its
    values are bad, ``value`` (an integer scalar) is shown in the message, ``text`` with
    ``{value}`` in it. Outside a checked program (shape inference, a region traced alone), nothing."""
    if _checks is not None:
        n = _node
        where = n.where if n is not None else None
        _checks.append((flag, value, n.sig.op if n is not None else "?", list(where) if where else None, text, kind))


@contextmanager
def loop_checks(collect=True):
    """While a loop's body is traced: the value checks its lowerings report go to the list
    yielded, not to the program's (the loop reports them once, over its iterations: ``add_check``);
    none are collected when the program is unchecked or ``collect`` is false."""
    global _checks, _node
    outer, was = _checks, _node
    mine = [] if outer is not None and collect else None
    _checks = mine
    try:
        yield mine if mine is not None else []
    finally:
        _checks, _node = outer, was


# int64 held in 32 bits (``xla.widths``): an op of ``widths.WRAPS`` is computed again in float32,
# which cannot wrap; a result that differs from it by more than float32's rounding (2**-16 of the
# value, plus 2), or a value float32 puts outside int32's range, wrapped or saturated.
WRAP_TEXT = "{value} element(s) of its int64 result " + widths.range_text("fall")
# the operands a float32 recomputation converts, where not every integer operand is a value
# (an index stays an index)
_VALUE_ARGS = {"aten::index_add": (0, 3), "aten::scatter_add": (0, 3)}


def _shifted(args, fargs):
    return fargs[0] * jnp.exp2(jnp.asarray(fargs[1], jnp.float32))


def _lcm(args, fargs):
    g = jnp.gcd(args[0], args[1]).astype(jnp.float32)  # exact: a gcd is no larger than its operands
    return jnp.where(g == 0, 0.0, jnp.abs(fargs[0]) / jnp.where(g == 0, 1.0, g) * jnp.abs(fargs[1]))


def _power(args, fargs):
    """An integer power; a negative exponent's (-1, 0 or 1) cannot leave the range."""
    a, b = (jnp.asarray(v, jnp.float32) for v in fargs[:2])
    return jnp.where(b < 0, 0.0, jnp.power(a, jnp.maximum(b, 0.0)))


# the ops whose lowering does not take floats, or whose float result is not the integer one:
# their result in float32 from the operands (integer, and as float32)
_FLOAT_FORMS = {"aten::__lshift__.Tensor": _shifted, "aten::__lshift__.Scalar": _shifted,
                "aten::bitwise_left_shift.Tensor": _shifted, "aten::bitwise_left_shift.Tensor_Scalar": _shifted,
                "aten::lcm": _lcm, "aten::pow.Tensor_Tensor": _power, "aten::pow.Scalar": _power,
                "aten::pow.Tensor_Scalar": _power}


def _as_float(x):
    if hasattr(x, "dtype") and hasattr(x, "shape") and jnp.issubdtype(x.dtype, jnp.integer):
        return x.astype(jnp.float32)
    if isinstance(x, (tuple, list)):
        return type(x)(_as_float(v) for v in x)
    return torch.float32 if x is torch.int64 else x


def check_wrap(sig, args, kwargs, res):
    """The value check of an op whose int64 result may have left the 32 bits it is held in."""
    global _checks
    outs = [i for i, m in enumerate(sig.outs) if m.dtype is torch.int64]
    if not outs:
        return
    picks = _VALUE_ARGS.get(sig.op)
    fargs = tuple(_as_float(a) if picks is None or i in picks else a for i, a in enumerate(args))
    fkw = {k: _as_float(v) for k, v in kwargs.items()}
    saved, _checks = _checks, None  # the lowering's own checks were reported once already
    try:
        with jax.default_matmul_precision("highest"):
            form = _FLOAT_FORMS.get(sig.op)
            if form is not None:
                f = form(args, fargs)
            else:
                f = sig.lower(_float_sig(sig), *fargs, **fkw)
    finally:
        _checks = saved
    f = f if isinstance(f, (tuple, list)) else (f,)
    for i in outs:
        fi = jnp.asarray(f[i]).astype(jnp.float32)
        ri = res[i].astype(jnp.float32)
        bad = (jnp.abs(fi - ri) > jnp.abs(fi) * 2.0 ** -16 + 2) | ~(jnp.abs(fi) < 2.0 ** 31)
        report(jnp.any(bad), jnp.sum(bad, dtype=jnp.int32), WRAP_TEXT)


def _float_sig(sig):
    """``sig`` with float32 where it says int64 (its outputs, its compute dtype)."""
    f32 = torch.float32
    outs = tuple(TensorMeta(m.shape, f32) if m.dtype is torch.int64 else m for m in sig.outs)
    cd = f32 if sig.cdtype is torch.int64 else sig.cdtype
    return OpSig(sig.op, sig.func, sig.lower, sig.template, outs, sig.params_text, cd)


def add_check(flag, value, info):
    """A loop's check over all its iterations: ``info`` is a body check's (op, where, text, kind)."""
    if _checks is not None:
        _checks.append((flag, value) + tuple(info))


_valid = ()  # while a padded node is lowered: (shape, mask) of its operands' real elements


def set_valid(masks):
    """While a padded node (``padding``) is lowered, value checks look only at its operands'
    real elements: ``masks`` are (shape, bool mask) pairs; returns the pairs it replaces."""
    global _valid
    old, _valid = _valid, tuple(masks)
    return old


def check_index(index, size, text, kind="RuntimeError", negative=False):
    """Report whether any of ``index`` falls outside ``[0, size)`` (``[-size, size)`` with
    ``negative``), showing the farthest out that does. One reduction over the indices: each
    is encoded as -1 when in bounds, 2k for ``size + k``, 2k - 1 for ``low - k``; the maximum
    says whether any is out and which."""
    if _checks is None or not getattr(index, "size", 0):
        return
    for shape, m in _valid:  # padding holds no index: only the real elements are checked
        if tuple(shape) == tuple(index.shape):
            index = jnp.where(m, index, 0)
            break
    flat = jnp.reshape(index, (-1,))
    low = -size if negative else 0
    hi, lo = jnp.max(flat), jnp.min(flat)
    # the farthest out is shown (distances compared in float32: no integer width can overflow)
    above = hi.astype(jnp.float32) - (size - 1)
    below = low - lo.astype(jnp.float32)
    report((hi >= size) | (lo < low), jnp.where(above >= below, hi, lo), text, kind)


# ---------------------------------------------------------------------------------------
# Internal nodes recorded by lazyxla itself (storage writes, conversions).
def lower_convert(sig, x):
    return x  # the generic output cast does the conversion; shape broadcasts


def lower_sharding(sig, x, sharding=None):
    """A sharding annotation (SPMD): ``x`` constrained to the layout ``sig.func`` (a jax
    NamedSharding); XLA's partitioner takes it from there."""
    return jax.lax.with_sharding_constraint(x, sig.func)


def lower_view_scatter(sig, base, src, views=None):
    """Write ``src`` into ``base`` through the chain of views ``sig.func`` ((view OpSig, output
    index) pairs, outermost first). A chain of views that each move every element once
    (reshapes, transposes, permutes: ``_UNVIEW``) is undone view by view, so the write is
    transposes and reshapes of ``src``; through any other chain, the chain applied to an index
    map of ``base`` says which element of ``base`` each element of ``src`` came from, and
    ``src`` is scattered there."""
    whole = _unviewed(sig.func, base, src)
    if whole is not None:
        return whole
    n = 1
    for s in base.shape:
        n *= s
    idx = jnp.arange(n, dtype=jnp.int32 if n <= widths.INT32_MAX else jnp.int64).reshape(base.shape)
    for vsig, index in sig.func:
        targs, tkw = vsig.template
        mapped = vsig.lower(vsig, *instantiate(targs, [idx]), **{k: instantiate(v, [idx]) for k, v in tkw})
        if isinstance(mapped, (tuple, list)):
            mapped = mapped[index]
        idx = jnp.asarray(mapped)
    flat = base.reshape(-1)
    flat = flat.at[idx.reshape(-1)].set(jnp.broadcast_to(src, idx.shape).reshape(-1).astype(base.dtype))
    return flat.reshape(base.shape)


def _args(vsig):
    return vsig.template[0][1:]  # the view's arguments after its input (plain Python values)


def _axes(dims, ndim):
    return [d % ndim for d in dims] if ndim else list(dims)


_RESHAPING = ("aten::view", "aten::_unsafe_view", "aten::alias", "aten::reshape", "aten::unsqueeze",
              "aten::squeeze", "aten::squeeze.dim", "aten::squeeze.dims", "aten::flatten.using_ints",
              "aten::unflatten.int")
_UNVIEW = {  # a view that moves every element of its input once: its output put back in its input's layout
    **{op: (lambda vsig, y, shape: jnp.reshape(y, shape)) for op in _RESHAPING},
    "aten::t": lambda vsig, y, shape: y.T if y.ndim == 2 else y,
    "aten::transpose.int": lambda vsig, y, shape: jnp.swapaxes(y, *_axes(_args(vsig), y.ndim)),
    "aten::permute": lambda vsig, y, shape: jnp.transpose(y, np.argsort(_axes(_args(vsig)[0], y.ndim))),
}


def _unviewed(chain, base, src):
    """``src`` written through ``chain`` as the whole new ``base``, when every view of the
    chain is in ``_UNVIEW``; else None."""
    if not all(vsig.op in _UNVIEW and index == 0 for vsig, index in chain):
        return None
    shapes = [tuple(base.shape)] + [tuple(vsig.outs[0].shape) for vsig, _ in chain]
    y = jnp.broadcast_to(src, shapes[-1]).astype(base.dtype)
    for (vsig, _), shape in zip(reversed(chain), reversed(shapes[:-1])):
        y = _UNVIEW[vsig.op](vsig, y, shape)
    return y
