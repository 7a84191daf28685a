"""From a torch op call to an IR node: the warm path of tracing.

``_dispatch`` receives every ATen call that involves a lazy tensor (``__torch_dispatch__``)
and every factory call aimed at the lazy device (the PrivateUse1 kernels registered here).
It builds a *signature key* from the op, each tensor's interned meta, and each non-tensor
argument (a Python scalar that is an op *value* enters only by kind, unless it is one of
the special scalars 0, 1, -1: R1.5). The key finds an ``OpSig`` that holds the output
metas, the lowering and the node hash prefix; on a miss the op runs once on meta tensors
(PyTorch's own shape and dtype rules, and its shape errors) and the result is cached, so
the warm path never pays meta shape inference again.

Then, by the op's schema:
- functional op: new storages for the outputs;
- view op: outputs share the input's storage and extend its view chain;
- in-place op: the functional value is written to the target's storage; written through a
  view, it is scattered back into the storage (functionalization by index map);
- no lowering: a PyTorch decomposition if there is one, else the CPU (R1.7, ``aten::<op>``).

May touch: tensors' storages, the live arena (through new tensors), the RNG chain, metrics.
Never compiles or executes, except through ``executor.read_values`` for value reads.
"""
from __future__ import annotations

import os
import warnings
import weakref

import torch
from torch._ops import OpOverload

from . import lowering, metrics, rng
from .ir import Node, OpSig, Slot, TensorMeta, data_leaf, fmt_where, user_frame
from .tensor import DEVICE, LazyTensor, Storage, become, to_device, value_of

aten = torch.ops.aten
_now = metrics.now_ns
_counter_inc = metrics.counter_inc
_COUNTERS = metrics.COUNTERS
TRACE_NS = metrics.pending_samples("LazyTracing", "time")  # per-op tracing time

NO_SPECIAL_SCALARS = os.environ.get("XLA_NO_SPECIAL_SCALARS", "0") not in ("", "0", "false", "False")


class LazyXlaError(RuntimeError):
    """A user error caught while recording an op; names the op and the user's line."""


# ---------------------------------------------------------------------------------------
# Per-op facts read once from the schema.
class FuncInfo:
    __slots__ = ("name", "counter", "value_pos", "value_kw", "kind", "functional", "written",
                 "view", "random", "special")

    def __init__(self, func: OpOverload):
        s = func._schema
        self.name = s.name + ("." + s.overload_name if s.overload_name else "")
        self.counter = "xla::" + s.name.split("::", 1)[-1]
        vp, vk = set(), set()
        written = []
        writes = any(a.alias_info is not None and a.alias_info.is_write for a in s.arguments)
        static = lowering.STATIC_ARGS.get(func) or \
            (lowering.STATIC_ARGS.get(lowering.functional_of(func), ()) if writes else ())
        for i, a in enumerate(s.arguments):
            ts = str(a.type)
            if a.name in static:
                pass
            elif ts.startswith("Scalar") or ts.startswith("Tensor") or ts.startswith("number"):
                (vk if a.kwarg_only else vp).add(i if not a.kwarg_only else a.name)
            if a.alias_info is not None and a.alias_info.is_write:
                written.append(a.name)
        self.value_pos = frozenset(vp)
        self.value_kw = frozenset(vk)
        self.written = tuple(written)
        self.view = (not written) and any(r.alias_info is not None for r in s.returns)
        if not written:
            self.kind = "view" if self.view else "functional"
        elif written == [s.arguments[0].name] and not s.arguments[0].kwarg_only:
            self.kind = "inplace"
        elif all(s.arguments[[x.name for x in s.arguments].index(w)].kwarg_only for w in written):
            self.kind = "out"
        else:
            self.kind = "mutating"
        self.functional = lowering.functional_of(func) if self.kind in ("inplace", "out") else func
        if self.functional is None and func in lowering.LOWERINGS:
            self.functional = func  # an in-place op lowered as itself (random fills: normal_, bernoulli_)
        self.random = lowering.is_random(self.functional) if self.functional is not None else False
        self.special = SPECIAL.get(func)
        if self.special is None and s.name.startswith("aten::_foreach_"):
            self.special = _foreach
        if self.special is None and self.kind == "inplace" and self.functional is not None \
                and self.functional is not func and _info(self.functional).view:
            self.special = _inplace_view  # t_, transpose_, unsqueeze_, squeeze_, as_strided_


_INFO: dict = {}


def _info(func) -> FuncInfo:
    i = _INFO.get(func)
    if i is None:
        i = _INFO[func] = FuncInfo(func)
    return i


# ---------------------------------------------------------------------------------------
# Signature keys.
_SIGS: dict = {}
_SCALAR_TYPES = (int, float, bool)


def _is_special(v) -> bool:
    return (not NO_SPECIAL_SCALARS) and (v == 0 or v == 1 or v == -1)


def _key_of(func, info, args, kwargs, ops, where):
    """Builds the signature key; appends the operands to ``ops``: a tensor's IR value, or a
    Python scalar that is an op value."""
    key = [func]
    vp = info.value_pos
    for i, a in enumerate(args):
        if type(a) is LazyTensor:  # the common case, inline
            ops.append(a._st.ir if a._chain is None else value_of(a))
            key.append(a._meta)
        else:
            key.append(_key_item(a, i in vp, ops, info, where))
    if kwargs:
        vk = info.value_kw
        for k, a in kwargs.items():
            key.append(k)
            key.append(_key_item(a, k in vk, ops, info, where))
    return tuple(key)


_PACKED_SEQUENCE_OPS = ("aten::_pack_padded_sequence", "aten::_pad_packed_sequence", "aten::lstm", "aten::gru",
                        "aten::rnn_tanh", "aten::rnn_relu")


def _key_item(a, is_value, ops, info, where):
    t = type(a)
    if t is LazyTensor:
        ops.append(value_of(a))
        return a._meta
    if t in _SCALAR_TYPES:
        if is_value and not _is_special(a):
            ops.append(a)
            return ("S", t)
        return (t, a)
    if t is list or t is tuple:
        return (t,) + tuple(_key_item(x, is_value, ops, info, where) for x in a)
    if isinstance(a, torch.Tensor):
        if isinstance(a, LazyTensor):
            ops.append(value_of(a))
            return a._meta
        if a.dim() == 0 and a.device.type == "cpu":
            up = to_device(a)
            ops.append(up._st.ir)
            return up._meta
        if info.name.split(".")[0] in _PACKED_SEQUENCE_OPS:
            raise LazyXlaError(
                f"{info.name}: lazyxla does not support packed sequences yet (PyTorch keeps their lengths on "
                f"the CPU) at {fmt_where(where or user_frame(1))}; pad the batch and mask the padding instead")
        raise LazyXlaError(
            f"{info.name}: expected all tensors on {DEVICE}, but one is on {a.device} "
            f"(shape {list(a.shape)}, {a.dtype}) at {fmt_where(where or user_frame(1))}. Move it with .to(lazyxla.device())."
        )
    if t is torch.device:
        return ("dev", a.type)
    return a


# ---------------------------------------------------------------------------------------
def _to_meta(a):
    if isinstance(a, LazyTensor):
        m = a._meta
        return torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device="meta")
    if isinstance(a, torch.Tensor):
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
    if isinstance(a, (list, tuple)):
        return type(a)(_to_meta(x) for x in a)
    if isinstance(a, torch.device):
        return torch.device("meta")
    return a


def _template(a, counter, is_value, sig_scalars, slot_metas):
    t = type(a)
    if isinstance(a, torch.Tensor):
        s = Slot(counter[0])
        counter[0] += 1
        slot_metas.append(a._meta if isinstance(a, LazyTensor) else TensorMeta(a.shape, a.dtype))
        return s
    if t in _SCALAR_TYPES:
        if is_value and not _is_special(a):
            s = Slot(counter[0])
            counter[0] += 1
            sig_scalars.append((s.i, t))
            slot_metas.append(None)  # a scalar: its dtype is decided below
            return s
        return a
    if t is list or t is tuple:
        return tuple(_template(x, counter, is_value, sig_scalars, slot_metas) for x in a)
    if t is torch.device:
        return "lazyxla"
    return a


def _flat_tensors(x, out):
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            _flat_tensors(y, out)
    return out


class _Entry:
    """A cached signature: how to record a call with this key."""

    __slots__ = ("sig", "mode", "scalar_dtypes", "const", "nops", "pattern", "returns")

    def __init__(self, sig, mode, scalar_dtypes=(), const=None, nops=0, pattern=None):
        self.returns = _returns(sig.func) if sig is not None and sig.func is not None else "one"
        self.pattern = pattern  # for tuple results with None (undefined) outputs: tensor positions
        self.sig = sig
        self.mode = mode  # "node" | "decomp" | "fallback" | "const"
        self.scalar_dtypes = scalar_dtypes
        self.const = const
        self.nops = nops


def _check_writable(t, name, where):
    """PyTorch refuses to write a tensor whose elements share memory (an ``expand``ed view):
    the same error, at the user's line, never a silently computed value."""
    m = t._meta
    if any(st == 0 and sz > 1 for sz, st in zip(m.shape, m.stride)):
        raise LazyXlaError(f"{name}: unsupported operation: more than one element of the written-to tensor refers "
                           f"to a single memory location. Please clone() the tensor before performing the "
                           f"operation. (at {fmt_where(where)})")


_FILLS = ("aten::fill_", "aten::zero_")  # one value everywhere: PyTorch allows them on expanded tensors


def _new_entry(func, info, args, kwargs, where) -> _Entry:
    if info.kind == "inplace" and isinstance(args[0], LazyTensor) and info.name.split(".")[0] not in _FILLS:
        _check_writable(args[0], info.name, where)
    elif info.kind == "out":
        for w in info.written:
            if isinstance((kwargs or {}).get(w), LazyTensor):
                _check_writable(kwargs[w], info.name, where)
    target = info.functional
    if info.kind == "out" and target is None:  # no functional form to infer shapes with
        return _Entry(None, "fallback")
    low = lowering.get(target) if target is not None else None
    margs = _to_meta(list(args))
    mkw = {k: _to_meta(v) for k, v in (kwargs or {}).items()}
    if info.kind == "out":
        for w in info.written:
            mkw.pop(w, None)
    call = target if target is not None else func
    try:
        mout = call(*margs, **mkw)
    except Exception as e:  # noqa: BLE001 - sorted into fallback or a user error below
        msg = str(e).split("\n")[0]
        low_msg = msg.lower()
        data_dependent = isinstance(e, torch._subclasses.fake_tensor.DynamicOutputShapeException) or any(
            w in low_msg for w in ("data-dependent", "data dependent", "nonzero", "dynamic output shape",
                                   "item() cannot be called on meta"))  # a Python value: allclose
        no_meta = isinstance(e, NotImplementedError) or ("meta" in low_msg and "not implemented" in low_msg)
        if data_dependent or (no_meta and low is None):
            # an output shape that depends on the values (boolean masks, nonzero, unique):
            # the CPU computes it (R1.7)
            return _Entry(None, "fallback")
        if no_meta:
            raise LazyXlaError(f"{info.name}: lazyxla cannot infer the output shape ({msg}) "
                               f"at {fmt_where(where)}") from None
        shapes = ", ".join(_describe(a) for a in args if isinstance(a, torch.Tensor)
                           or isinstance(a, (list, tuple)))
        raise LazyXlaError(f"{info.name}({shapes}): {msg} at {fmt_where(where)}") from None
    outs = _flat_tensors(mout, [])
    if info.kind == "inplace":
        _check_inplace(func, args, kwargs, where, info)
        if outs and not torch.can_cast(outs[0].dtype, args[0].dtype):
            raise LazyXlaError(f"{info.name}: result type {_dtype_name(outs[0].dtype)} can't be cast to the "
                               f"desired output type {_dtype_name(args[0].dtype)} at {fmt_where(where)}")
    if not outs and not info.written:  # sizes, strides, dtypes: a constant of the signature
        return _Entry(None, "const", const=mout)
    if low is None or not outs:  # an op that writes its arguments and returns nothing is never a constant
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            return _Entry(None, "implicit")
        if target is not None and target in lowering.DECOMPOSITIONS:
            return _Entry(None, "decomp")
        return _Entry(None, "fallback")
    counter = [0]
    scal = []
    slot_metas = []
    vp, vk = info.value_pos, info.value_kw
    targs = tuple(_template(a, counter, i in vp, scal, slot_metas) for i, a in enumerate(args))
    tkw = {k: _template(v, counter, k in vk, scal, slot_metas) for k, v in (kwargs or {}).items()
           if not (info.kind == "out" and k in info.written)}
    if info.random:
        tkw["__seed__"] = Slot(counter[0])
        counter[0] += 1
        slot_metas.append(TensorMeta((), torch.int64))
    template = (targs, tuple(sorted(tkw.items())))
    out_metas = [TensorMeta(o.shape, o.dtype, o.stride()) for o in outs]
    if info.kind == "inplace":
        out_metas = [args[0]._meta]
    tensors = _flat_tensors(list(args), [])
    cdtype = _promoted([a for a in args], tensors)
    sdt = {}
    for slot_i, pytype in scal:
        sdt[slot_i] = _scalar_dtype(pytype, tensors)
    op = _info(target).name
    sig = OpSig(op, target, low, template, out_metas, cdtype=cdtype)
    pattern = None
    if isinstance(mout, (tuple, list)) and any(o is None for o in mout):
        pattern = tuple(o is not None for o in mout)
    for i, dt in sdt.items():
        slot_metas[i] = TensorMeta((), dt)
    _check_lowering(sig, slot_metas, info, args, where)
    return _Entry(sig, "node", sdt, nops=counter[0], pattern=pattern)


def _dtype_name(dt):
    return {torch.float32: "Float", torch.float64: "Double", torch.int64: "Long", torch.int32: "Int",
            torch.bool: "Bool", torch.float16: "Half", torch.bfloat16: "BFloat16"}.get(dt, str(dt))


def _check_inplace(func, args, kwargs, where, info):
    """An in-place op must keep its target's shape and dtype: PyTorch's own meta kernel of
    the in-place op says whether the result can be cast back. Ops that change the tensor's
    shape in place are special (_inplace_view, _resize); one that is not found here is refused."""
    margs = _to_meta(list(args))
    try:
        func(*margs, **{k: _to_meta(v) for k, v in (kwargs or {}).items()})
    except Exception as e:  # noqa: BLE001 - PyTorch's own error, at the user's line
        msg = str(e).split("\n")[0]
        raise LazyXlaError(f"{info.name}: {msg} at {fmt_where(where)}") from None
    target = args[0]
    if tuple(margs[0].shape) != tuple(target.shape) or margs[0].dtype != target.dtype:
        raise LazyXlaError(f"{info.name}: a lazyxla tensor cannot change its shape or dtype in place "
                           f"({target._meta!r} -> {TensorMeta.of(margs[0])!r}) at {fmt_where(where)}; use the "
                           f"out-of-place op instead")


def _check_lowering(sig, slot_metas, info, args, where):
    """Trace the lowering once, abstractly, when a signature is first seen: an op the
    lowering cannot do fails here, at the user's line, not later inside a whole program."""
    import jax
    from .runtime import jnp_dtype
    specs = [jax.ShapeDtypeStruct(m.shape, jnp_dtype(m.dtype)) for m in slot_metas]
    try:
        jax.eval_shape(lambda *v: lowering.lower_call(sig, v), *specs)
    except Exception as e:  # noqa: BLE001 - every failure becomes the user's error
        shapes = ", ".join(_describe(a) for a in args if isinstance(a, (torch.Tensor, list, tuple)))
        msg = str(e).split("\n")[0]
        raise LazyXlaError(f"{info.name}({shapes}) is not supported by lazyxla: {type(e).__name__}: {msg} "
                           f"at {fmt_where(where)}") from None


def _promoted(args, tensors):
    try:
        vals = [a for a in args if isinstance(a, torch.Tensor) or type(a) in _SCALAR_TYPES]
        if not vals:
            return None
        dt = None
        for v in vals:
            if isinstance(v, torch.Tensor):
                m = torch.empty((0,) if v.dim() else (), dtype=v.dtype, device="meta")
            else:
                m = v
            if dt is None:
                dt = m
            else:
                dt = torch.empty((0,), dtype=torch.result_type(dt, m), device="meta") \
                    if (isinstance(dt, torch.Tensor) and dt.dim()) or (isinstance(m, torch.Tensor) and m.dim()) \
                    else torch.empty((), dtype=torch.result_type(dt, m), device="meta")
        return dt.dtype if isinstance(dt, torch.Tensor) else None
    except Exception:
        return None


def _scalar_dtype(pytype, tensors):
    if pytype is bool:
        return torch.bool
    fl = [t.dtype for t in tensors if t.dtype.is_floating_point]
    if pytype is float:
        if fl:
            d = fl[0]
            return torch.float32 if d in (torch.float16, torch.bfloat16) else d
        return torch.get_default_dtype()
    if fl:
        d = fl[0]
        return torch.float32 if d in (torch.float16, torch.bfloat16) else d
    ints = [t.dtype for t in tensors if not t.dtype.is_floating_point and t.dtype != torch.bool]
    return ints[0] if ints else torch.int64


def _describe(a):
    if isinstance(a, LazyTensor):
        return repr(a._meta)
    if isinstance(a, torch.Tensor):
        return f"{a.dtype}{list(a.shape)}@{a.device}"
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(_describe(x) for x in a) + "]"
    return repr(a)


# ---------------------------------------------------------------------------------------
# Scalars that become device data (R1.5), cached by value and dtype.
_SCALAR_CACHE: dict = {}


def _scalar_value(v, dtype):
    k = (type(v), v, dtype)
    leaf = _SCALAR_CACHE.get(k)
    if leaf is None:
        from .runtime import scalar_array
        _counter_inc("DeviceDataCacheMiss")
        if len(_SCALAR_CACHE) > 4096:
            _SCALAR_CACHE.clear()
        leaf = _SCALAR_CACHE[k] = (data_leaf(scalar_array(v, dtype), TensorMeta((), dtype)), 0)
    return leaf


# ---------------------------------------------------------------------------------------
def _dispatch(func, args, kwargs):
    t0 = _now()
    info = _INFO.get(func)
    if info is None:
        info = _info(func)
    if info.special is not None:
        return info.special(func, args, kwargs or {})
    return _record(func, info, args, kwargs, t0)


def _record(func, info, args, kwargs, t0=None):
    """Record one call as an IR node (or decompose it / fall back to the CPU)."""
    if t0 is None:
        t0 = _now()
    ops = []
    key = _key_of(func, info, args, kwargs, ops, None)
    entry = _SIGS.get(key)
    if entry is None:
        where = user_frame(3)
        entry = _SIGS[key] = _new_entry(func, info, args, kwargs, where)
    mode = entry.mode
    if mode != "node":
        if mode == "const":
            return entry.const
        if mode == "decomp":
            return _decompose(func, info, args, kwargs)
        if mode == "implicit":
            return func.decompose(*args, **(kwargs or {}))
        return _fallback(func, info, args, kwargs)
    c = info.counter
    _COUNTERS[c] = _COUNTERS.get(c, 0) + 1
    sig = entry.sig
    sdt = entry.scalar_dtypes  # operand index -> dtype of each Python scalar operand
    if sdt:
        vals = tuple([v if type(v) is tuple else _scalar_value(v, sdt[i]) for i, v in enumerate(ops)])
    else:
        vals = tuple(ops)
    if info.random:
        vals += (rng.next_seed(),)
    node = Node(sig, vals, user_frame(3))
    kind = info.kind
    if kind == "functional":
        if entry.returns == "one":
            m = sig.outs[0]
            out = LazyTensor(Storage((node, 0), m), m)
        else:
            out = _wrap_outputs(node, sig, entry.returns)
        if entry.pattern is not None:
            it = iter(out)
            out = tuple(next(it) if p else None for p in entry.pattern)
    elif kind == "inplace":
        out = args[0]
        write(out, (node, 0))
    elif kind == "view":
        out = _wrap_views(node, sig, args[0], entry.returns)
    elif kind == "out":
        out = _write_out(node, sig, info, kwargs)
    else:
        raise LazyXlaError(f"{info.name}: mutating op without a lowering at {fmt_where(node.where)}")
    TRACE_NS.append(_now() - t0)
    return out


def _wrap_outputs(node, sig, returns="one"):
    if returns == "one":
        m = sig.outs[0]
        return LazyTensor(Storage((node, 0), m), m)
    res = [LazyTensor(Storage((node, i), m), m) for i, m in enumerate(sig.outs)]
    return res if returns == "list" else tuple(res)


def _wrap_views(node, sig, src, returns):
    st = src._st
    base_chain = src._chain or ()
    res = []
    for i, m in enumerate(sig.outs):
        t = LazyTensor(st, m, base_chain + ((sig, i),))
        t._ir = (node, i)
        t._sv = st.version
        res.append(t)
    if returns == "one":
        return res[0]
    return res if returns == "list" else tuple(res)


def _returns(func) -> str:
    """How an op returns its tensors: "one", "list" (Tensor[]) or "tuple"."""
    rs = func._schema.returns
    if len(rs) == 1:
        return "list" if str(rs[0].type).startswith("List") else "one"
    return "tuple"


def _write_out(node, sig, info, kwargs):
    outs = [kwargs[w] for w in info.written]
    for i, o in enumerate(outs):
        if not isinstance(o, LazyTensor):
            raise LazyXlaError(f"{info.name}: out= must be a lazyxla tensor")
        if o._meta.shape != sig.outs[i].shape:  # PyTorch resizes out= (with a warning unless it was empty)
            if o._meta.numel:
                warnings.warn_explicit(
                    f"{info.name}: an out= tensor with {o._meta.numel} elements was resized from "
                    f"{list(o._meta.shape)} to {list(sig.outs[i].shape)}", UserWarning,
                    *(user_frame(1) or ("<unknown>", 0))[:2], module="lazyxla")
            _resize(aten.resize_.default, (o, list(sig.outs[i].shape)), {})
        write(o, _convert((node, i), sig.outs[i], o._meta))
    return outs[0] if len(outs) == 1 else tuple(outs)


# ---------------------------------------------------------------------------------------
# Writes: in-place updates, through views by index-map scatter.
_SCATTER_SIGS: dict = {}
_CONVERT_SIGS: dict = {}


def _convert(value, src_meta, dst_meta):
    if src_meta is dst_meta or (src_meta.dtype == dst_meta.dtype and src_meta.shape == dst_meta.shape):
        return value
    k = (src_meta, dst_meta)
    sig = _CONVERT_SIGS.get(k)
    if sig is None:
        sig = _CONVERT_SIGS[k] = OpSig("lazyxla::convert", None, lowering.lower_convert,
                                       ((Slot(0),), ()), (dst_meta,))
    return (Node(sig, (value,)), 0)


def write(t: LazyTensor, value):
    """Make ``value`` (an IR value of t's meta) the new value of ``t`` and its aliases.

    Through a view, the new value is scattered into the storage in one step, by the index map
    of the whole view chain: only the elements of ``t`` are written, even where an outer view
    repeats elements of the storage (a row of an ``expand``ed tensor)."""
    st = t._st
    chain = t._chain
    if not chain:
        st.set_ir(value)
        return
    ssig = _SCATTER_SIGS.get(chain)
    if ssig is None:
        ssig = _SCATTER_SIGS[chain] = OpSig(
            "lazyxla::view_scatter", chain, lowering.lower_view_scatter,
            ((Slot(0), Slot(1)), (("views", tuple((vsig.hb, i) for vsig, i in chain)),)), (st.meta,))
    st.set_ir((Node(ssig, (st.ir, value), None), 0))
    t._ir = value
    t._sv = st.version


def replay_chain(base_value, chain):
    v = base_value
    for vsig, i in chain:
        v = (Node(vsig, (v,)), i)
    return v


# ---------------------------------------------------------------------------------------
def _decompose(func, info, args, kwargs):
    """Record the op through a decomposition; one that declines (returns NotImplemented, as
    PyTorch's do for cases they do not cover) sends the op to the CPU instead."""
    fn = lowering.DECOMPOSITIONS[info.functional]
    kw = dict(kwargs or {})
    outs = [kw.pop(w) for w in info.written] if info.kind == "out" else None
    r = fn(*args, **kw)
    if r is NotImplemented:
        return _fallback(func, info, args, kwargs)
    if info.kind in ("functional", "mutating"):  # a mutating op's decomposition writes itself
        return r
    if info.kind == "out":
        rs = r if isinstance(r, (tuple, list)) else (r,)
        for o, v in zip(outs, rs):
            o.copy_(v)
        return outs[0] if len(outs) == 1 else tuple(outs)
    args[0].copy_(r)
    return args[0]


def _fallback(func, info, args, kwargs):
    """R1.7: run the op on the CPU with its inputs read, upload the results."""
    from .executor import read_values
    _counter_inc("aten::" + info.name.split("::", 1)[-1].split(".")[0])
    lazies = _flat_tensors([args, list((kwargs or {}).values())], [])
    lazies = [t for t in lazies if isinstance(t, LazyTensor)]
    hosts = read_values(lazies) if lazies else []
    table = {id(t): h for t, h in zip(lazies, hosts)}

    def to_host(a):
        if isinstance(a, LazyTensor):
            return table[id(a)]
        if isinstance(a, (list, tuple)):
            return type(a)(to_host(x) for x in a)
        if isinstance(a, torch.device) and a.type == DEVICE.type:
            return torch.device("cpu")
        return a

    hargs = to_host(list(args))
    hkw = {k: to_host(v) for k, v in (kwargs or {}).items()}
    r = func(*hargs, **hkw)
    if info.written:  # the CPU changed the host copies of the written tensors: upload them back
        for a in _written_tensors(func, info, args, kwargs):
            up = to_device(table[id(a)])
            write(a, _convert(up._st.ir, up._meta, a._meta))
        if info.kind == "inplace":
            return args[0]

    def back(x):
        if isinstance(x, torch.Tensor):
            for a in lazies:
                if table[id(a)] is x:
                    return a
            return to_device(x)
        if isinstance(x, (list, tuple)):
            return type(x)(back(y) for y in x)
        return x

    return back(r)


def _written_tensors(func, info, args, kwargs):
    """The lazy tensors passed in the arguments the op's schema marks as written."""
    out = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.name not in info.written:
            continue
        v = args[i] if i < len(args) else (kwargs or {}).get(arg.name)
        out += [t for t in _flat_tensors(v, []) if isinstance(t, LazyTensor)]
    return out


# ---------------------------------------------------------------------------------------
# Ops with their own handling (transfers, reads, aliases).
def _identity_alias(func, args, kwargs):
    src = args[0]
    t = LazyTensor(src._st, src._meta, src._chain)
    if src._chain:
        t._ir = src._ir
        t._sv = src._sv
    return t


def _local_scalar_dense(func, args, kwargs):
    from .executor import read_values
    _counter_inc("aten::_local_scalar_dense")
    return read_values([args[0]])[0].item()


def _to_copy(func, args, kwargs):
    """``.to(...)``: to another device is a value read; a dtype change is recorded."""
    src = args[0]
    dev = kwargs.get("device")
    if dev is not None and torch.device(dev).type != DEVICE.type:
        from .executor import read_values
        host = read_values([src])[0]
        if kwargs.get("dtype") is not None and kwargs["dtype"] != host.dtype:
            host = host.to(kwargs["dtype"])
        if torch.device(dev).type != "cpu":
            host = host.to(dev)
        return host.pin_memory() if kwargs.get("pin_memory") else host
    kw = {"dtype": kwargs["dtype"]} if kwargs.get("dtype") is not None else {}
    return _record(func, _info(func), (src,), kw)


def _copy_(func, args, kwargs):
    dst, src = args[0], args[1]
    if not isinstance(dst, LazyTensor):
        from .executor import read_values
        host = read_values([src])[0]
        dst.copy_(host)
        return dst
    if 0 in dst._meta.stride:
        _check_writable(dst, "aten::copy_", user_frame(1))
    if not isinstance(src, LazyTensor):
        src = to_device(src)
    if src._meta.shape == dst._meta.shape and src._meta.dtype == dst._meta.dtype:
        write(dst, value_of(src))
    else:  # broadcast and/or convert: recorded as aten::copy
        _record(func, _info(func), (dst, src), {})
    return dst


def _lift(func, args, kwargs):
    return args[0]


def _set(func, args, kwargs):
    """``t.set_(src)``: t becomes an alias of src, with src's shape and dtype."""
    t = args[0]
    src = args[1] if len(args) > 1 else kwargs.get("source")
    if isinstance(src, LazyTensor):
        become(t, src)
        return t
    raise LazyXlaError(f"{_info(func).name}: lazyxla can only make a tensor an alias of another lazy tensor "
                       f"(got {_describe(src)}) at {fmt_where(user_frame(1))}")


def _inplace_view(func, args, kwargs):
    """``t_``, ``transpose_``, ``unsqueeze_``, ``squeeze_``, ``as_strided_``: the tensor itself
    becomes the view (same storage, new shape and strides), as in PyTorch."""
    t = args[0]
    become(t, _info(func).functional(*args, **kwargs))
    return t


def _resize(func, args, kwargs):
    """``resize_``: the first elements are kept (in row-major order) and new ones are zero
    (PyTorch leaves them uninitialized); the tensor gets a storage of its own."""
    t, size = args[0], tuple(args[1])
    if size == tuple(t.shape):
        return t
    if t._chain:
        raise LazyXlaError(f"{_info(func).name}: lazyxla cannot resize a view ({list(t.shape)} -> {list(size)}) "
                           f"at {fmt_where(user_frame(1))}; resize the tensor it views, or make a new tensor")
    n = 1
    for d in size:
        n *= d
    with torch.no_grad():
        flat = aten.reshape.default(t, [-1])
        have = flat.shape[0]
        if n <= have:
            flat = aten.slice.Tensor(flat, 0, 0, n)
        else:
            flat = aten.cat.default([flat, aten.zeros.default([n - have], dtype=t.dtype, device=DEVICE)])
        become(t, aten.clone.default(aten.reshape.default(flat, list(size))))
    return t


def _foreach(func, args, kwargs):
    """``_foreach_<op>[_]``: the same op on each element of the lists, recorded one by one."""
    name = func._schema.name.split("::")[1][len("_foreach_"):]
    single = getattr(aten, name)
    n = next(len(a) for a in args if isinstance(a, (list, tuple)))
    per = [isinstance(a, (list, tuple)) and len(a) == n for a in args]
    if name in ("addcdiv_", "addcmul_", "addcdiv", "addcmul") and len(args) == 4:
        vals = args[3]
        args, per = args[:3], per[:3]
        kws = [dict(kwargs, value=(vals[i].item() if isinstance(vals, torch.Tensor) else vals[i])
                    if per_v else vals) for i, per_v in ((i, isinstance(vals, (list, tuple, torch.Tensor)))
                                                         for i in range(n))]
    else:
        kws = [kwargs] * n
    res = [single(*[a[i] if p else a for a, p in zip(args, per)], **kws[i]) for i in range(n)]
    return None if name.endswith("_") else res


SPECIAL = {
    aten.detach.default: _identity_alias,
    aten.alias.default: _identity_alias,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten._to_copy.default: _to_copy,
    aten.copy_.default: _copy_,
    aten.lift_fresh.default: _lift,
    aten.resize_.default: _resize,
    aten.resize_as_.default: lambda func, args, kwargs: _resize(func, (args[0], list(args[1].shape)), {}),
    aten.set_.source_Tensor: _set,
}



# ---------------------------------------------------------------------------------------
# Factories aimed at the lazy device reach PrivateUse1 kernels (no lazy tensor argument yet).
def _factory(func, args, kwargs):
    kwargs = dict(kwargs)
    kwargs.pop("pin_memory", None)
    return _dispatch(func, args, kwargs)


def _upload_to_copy(src, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
                    memory_format=None):
    host = src if dtype is None or dtype == src.dtype else src.to(dtype)
    up = to_device(host)
    if isinstance(src, torch.nn.Parameter):
        _note_parameter_upload(src, up)
    return up


# A CPU parameter shared by two modules (tied weights) reaches the upload once per module when
# ``model.to(lazyxla.device())`` converts them: PyTorch keeps the tie only for devices whose
# tensors can take a CPU tensor's data in place (CUDA can; lazyxla's, like torch_xla's, cannot).
# Two live uploads of one unchanged parameter say the tie was broken: tell the user.
# id of a live CPU Parameter -> (a weak reference whose callback drops the entry when the
# Parameter dies, its version, a weak reference to its upload's storage)
_UPLOADED_PARAMS: dict = {}


def _note_parameter_upload(src, up):
    prev = _UPLOADED_PARAMS.get(id(src))
    if prev is not None and prev[1] == src._version and prev[2]() is not None:
        where = user_frame(1) or ("<unknown>", 0, "")
        warnings.warn_explicit(
            f"lazyxla: the same Parameter ({_describe(src)}) was moved to {DEVICE} twice: if it is shared by "
            f"two modules (tied weights), Module.to() gave each module its own copy (torch_xla does the same). "
            f"Tie them again after .to(), e.g. model.head.weight = model.embed.weight, or call the model's "
            f"tie_weights().", UserWarning, where[0], where[1], module="lazyxla")
    key = id(src)
    _UPLOADED_PARAMS[key] = (weakref.ref(src, lambda _r, k=key: _UPLOADED_PARAMS.pop(k, None)), src._version,
                             weakref.ref(up._st))


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return _dispatch(aten.empty.memory_format, (list(size),), {"dtype": dtype, "device": DEVICE})


_lib = torch.library.Library("aten", "IMPL")
_lib.impl("_to_copy", _upload_to_copy, "PrivateUse1")
_lib.impl("empty_strided", _empty_strided, "PrivateUse1")

FACTORIES = ["arange", "arange.start", "arange.start_step", "full", "zeros", "ones", "scalar_tensor",
             "linspace", "logspace", "eye", "eye.m", "randperm", "rand", "randn", "randint", "randint.low",
             "empty.memory_format", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like"]


def _make_factory(op):
    def kernel(*args, **kwargs):
        return _factory(op, args, kwargs)
    return kernel


for _f in FACTORIES:
    _n, _, _o = _f.partition(".")
    _op = getattr(getattr(aten, _n), _o or "default")
    _lib.impl(_f, _make_factory(_op), "PrivateUse1")


# Recurrent layers: on a non-CPU device PyTorch's composite RNN picks fused cells that exist
# only for CUDA; registered above autograd, PyTorch's own decompositions into plain ops run
# instead (and autograd differentiates those).
_autograd_lib = torch.library.Library("aten", "IMPL")
for _name in ("lstm.input", "lstm.data", "gru.input", "gru.data", "rnn_tanh.input", "rnn_tanh.data",
              "rnn_relu.input", "rnn_relu.data"):
    _n, _, _o = _name.partition(".")
    _op = getattr(getattr(aten, _n), _o)
    _autograd_lib.impl(_name, lowering.DECOMPOSITIONS[_op], "AutogradPrivateUse1")


def _pu1_fallback(keyset, op, *args, **kwargs):
    return _factory(op, args, kwargs)


_fallback_lib = torch.library.Library("_", "IMPL")
_fallback_lib.fallback(_pu1_fallback, dispatch_key="PrivateUse1", with_keyset=True)
