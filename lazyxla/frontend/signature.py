"""Signatures: what recording an op call needs to know, worked out once per signature.

A *signature key* is the op with each tensor's interned meta and each non-tensor argument
(a Python scalar that is an op *value* enters only by kind, unless it is one of the special
scalars 0, 1, -1: R1.5). The first call with a key comes here (``new_entry``): the checks
PyTorch's CPU kernels make and its meta kernels do not are made (``checks``: arguments, out=
dtypes), the op runs once on meta tensors (PyTorch's own shape and dtype rules, and its shape
errors; for an op PyTorch has no meta kernel for, lazyxla's shape rule from
``lowering.SHAPE_RULES``), the call
is turned into an ``OpSig`` (the op, its parameters as a template with ``Slot``s for
operands, its output metas, its lowering), and the lowering is traced abstractly, so that an
op lazyxla cannot do fails at the user's line, not later inside a whole program. The
``Entry`` says how later calls with the key are recorded: as a node, through a PyTorch
decomposition, as a constant, or on the CPU. ``info(func)`` holds the facts read from an
op's schema (functional, in-place, out=, view; its value arguments; for an out= op, which
inputs its out= tensors may not overlap: ``checks.overlap_rule``).

This is the cold path: the warm path (``tensor.py``) never pays meta shape inference again.
With the persistent cache on, a lowering check that passed once is remembered on disk
(``persistent_cache``), so a new process's first step does not trace it again.
Works on any torch tensors through their public attributes. May touch: its own caches and the
persistent cache's remembered checks.
"""
from __future__ import annotations

import functools
import os

import jax
import torch
from torch._ops import OpOverload

from . import checks
from .. import lowering
from ..compiler import persistent_cache
from ..config import __version__, env_flag
from ..hashing import encode, fold
from .device import is_lazy
from ..errors import LazyXlaError
from ..ir.node import OpSig, Slot, TensorMeta
from ..ir.user_line import fmt_where
from ..xla import jax_internals, widths
from ..xla.client import jax_device, jnp_dtype

# R1.5: XLA_NO_SPECIAL_SCALARS=1 makes 0, 1 and -1 device data like every other scalar.
NO_SPECIAL_SCALARS = env_flag("XLA_NO_SPECIAL_SCALARS", False)


# ---------------------------------------------------------------------------------------
# Per-op facts read once from the schema.
class FuncInfo:
    __slots__ = ("func", "name", "counter", "arg_names", "value_pos", "value_kw", "kind", "functional",
                 "written", "view", "random", "overlap")

    def __init__(self, func: OpOverload):
        s = func._schema
        self.func = func
        self.name = s.name + ("." + s.overload_name if s.overload_name else "")
        self.counter = "xla::" + s.name.split("::", 1)[-1]
        self.arg_names = tuple(a.name for a in s.arguments)
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
        self.view = lowering.is_view(func)
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
        # an out= op whose out= tensors PyTorch refuses to let share elements with its inputs
        self.overlap = checks.overlap_rule(func, self) if self.kind == "out" else None

    @property
    def inplace_view(self) -> bool:
        """An in-place op whose functional form is a view (t_, transpose_, unsqueeze_, squeeze_,
        as_strided_): the tensor itself takes the view's shape."""
        f = self.functional
        return self.kind == "inplace" and f is not None and f is not self.func and op_info(f).view


_INFO: dict = {}


def op_info(func) -> FuncInfo:
    i = _INFO.get(func)
    if i is None:
        i = _INFO[func] = FuncInfo(func)
    return i


SCALAR_TYPES = (int, float, bool, complex)


# The special scalars (R1.5); the warm path tests ``v in SPECIAL_SCALARS`` inline.
SPECIAL_SCALARS = () if NO_SPECIAL_SCALARS else (0, 1, -1)


class AsData(float):
    """A Python number recorded as device data even where it is 0, 1 or -1, the special
    scalars a program holds as constants (R1.5): for a number that takes other values in the
    same place at other calls, so that all of them record one graph (``optimizer_state``: the 1
    an SGD first step adds its gradient with, where later steps add ``1 - dampening``). It
    reaches the op only through a special's ``Record``: PyTorch's dispatcher passes plain numbers."""
    __slots__ = ()


def is_special(v) -> bool:
    return v in SPECIAL_SCALARS and type(v) is not AsData


# ---------------------------------------------------------------------------------------
def _to_meta(a):
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
        slot_metas.append(TensorMeta.of(a) if is_lazy(a) else TensorMeta(a.shape, a.dtype))
        return s
    if t in SCALAR_TYPES or t is AsData:
        if is_value and not is_special(a):
            s = Slot(counter[0])
            counter[0] += 1
            sig_scalars.append((s.i, float if t is AsData else t))
            slot_metas.append(None)  # a scalar: its dtype is decided below
            return s
        return a
    if t is list or t is tuple:
        return tuple(_template(x, counter, is_value, sig_scalars, slot_metas) for x in a)
    if t is torch.device:
        return "lazyxla"
    return a


def flat_tensors(x, out):
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            flat_tensors(y, out)
    return out


class Entry:
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


def check_writable(t, name, where):
    """PyTorch refuses to write a tensor whose elements share memory (an ``expand``ed view):
    the same error, at the user's line, never a silently computed value."""
    if any(st == 0 and sz > 1 for sz, st in zip(t.shape, t.stride())):
        raise LazyXlaError(f"{name}: unsupported operation: more than one element of the written-to tensor refers "
                           f"to a single memory location. Please clone() the tensor before performing the "
                           f"operation. (at {fmt_where(where)})")


def new_entry(func, info, args, kwargs, where) -> Entry:
    """How calls with this signature are recorded (see the module docstring); raises
    LazyXlaError, naming the op and the user's line, for a call PyTorch itself refuses (its meta
    kernel, or the checks of its CPU kernel that ``checks`` makes)."""
    checks.check_call(func, info, args, kwargs, where)
    _check_writes(info, args, kwargs, where)
    target = info.functional
    if info.kind == "out" and target is None:  # no functional form to infer shapes with
        return Entry(None, "fallback")
    mout = _run_on_meta(target if target is not None else func, info, args, kwargs, where)
    if mout is _NEEDS_VALUES:  # e.g. an output shape that depends on the values: the CPU computes it (R1.7)
        return Entry(None, "fallback")
    rule = lowering.OUTPUT_DTYPES.get(target)
    if rule is not None:  # the CPU kernel's dtypes where its meta kernel says others
        mout = _with_dtypes(mout, rule(*args, **(kwargs or {})))
    outs = flat_tensors(mout, [])
    if info.kind == "out":
        checks.check_out_dtypes(func, info, kwargs, outs, where)
    if info.kind == "inplace":
        _check_inplace(func, args, kwargs, where, info, outs)
    if not outs and not info.written:  # sizes, strides, dtypes: a constant of the signature
        return Entry(None, "const", const=mout)
    low = None if target is None else lowering.get(
        target, jax_device().platform,
        emulated_float64=widths.emulated_widths(
            o.dtype for o in flat_tensors([outs, args, list((kwargs or {}).values())], [])),
        call=(args, kwargs or {}))
    if low is None or not outs:  # an op that writes its arguments and returns nothing is never a constant
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            return Entry(None, "implicit")
        if target is not None and target in lowering.DECOMPOSITIONS and target not in lowering.LOWERINGS:
            return Entry(None, "decomp")  # (a lowering ruled out here runs on the CPU as itself, aten::<op>)
        return Entry(None, "fallback")
    return _node_entry(info, target, low, args, kwargs, mout, outs, where)


def _with_dtypes(mout, dtypes):
    """The meta result ``mout`` (a tuple of tensors) with each output in ``dtypes``' dtype (None: kept)."""
    return type(mout)(o if d is None or o is None or o.dtype == d else o.to(d) for o, d in zip(mout, dtypes))


_FILLS = ("aten::fill_", "aten::zero_")  # one value everywhere: PyTorch allows them on expanded tensors


def _check_writes(info, args, kwargs, where):
    if info.kind == "inplace" and is_lazy(args[0]) and info.name.split(".")[0] not in _FILLS:
        check_writable(args[0], info.name, where)
    elif info.kind == "out":
        for w in info.written:
            if is_lazy((kwargs or {}).get(w)):
                check_writable(kwargs[w], info.name, where)


_NEEDS_VALUES = object()


def _run_on_meta(call, info, args, kwargs, where):
    """The op's result on meta tensors (PyTorch's shapes and dtypes), or ``_NEEDS_VALUES``.
    An op PyTorch has no meta kernel for takes lazyxla's shape rule, if it has one
    (``lowering.SHAPE_RULES``)."""
    margs = _to_meta(list(args))
    mkw = {k: _to_meta(v) for k, v in (kwargs or {}).items()
           if not (info.kind == "out" and k in info.written)}
    try:
        return call(*margs, **mkw)
    except Exception as e:  # noqa: BLE001 - either the values are needed, or it is the user's error
        if not _needs_values(e):
            raise _meta_error(info, args, e, where) from None
    rule = lowering.SHAPE_RULES.get(call)
    if rule is None:
        return _NEEDS_VALUES
    try:
        return rule(*margs, **mkw)
    except NotImplementedError:  # the rule says the shapes depend on the values
        return _NEEDS_VALUES
    except Exception as e:  # noqa: BLE001 - the user's error, as PyTorch would report it
        raise _meta_error(info, args, e, where) from None


def _meta_error(info, args, e, where):
    shapes = ", ".join(describe(a) for a in args if isinstance(a, (torch.Tensor, list, tuple)))
    return LazyXlaError(f"{info.name}({shapes}): {str(e).splitlines()[0] if str(e) else type(e).__name__} "
                        f"at {fmt_where(where)}")


_VALUE_EXCEPTIONS = (NotImplementedError, torch._subclasses.fake_tensor.DynamicOutputShapeException,
                     torch._subclasses.fake_tensor.DataDependentOutputException)


def _needs_values(e) -> bool:
    """Whether PyTorch could not work out the result without the tensors' values: no meta
    kernel (NotImplementedError: nonzero, masked_select, unique ... whose output shape depends
    on the values), a dynamic output shape, or a Python value computed from the values
    (PyTorch says so only in a RuntimeError's text: ``Tensor.item() cannot be called on meta
    tensors``, from allclose or equal; or ``... not implemented for 'Meta'``)."""
    if isinstance(e, _VALUE_EXCEPTIONS):
        return True
    text = str(e).lower()
    return isinstance(e, RuntimeError) and ("item() cannot be called on meta" in text
                                            or ("meta" in text and "not implemented" in text))


def _node_entry(info, target, low, args, kwargs, mout, outs, where) -> Entry:
    """An entry that records the call as one node: its signature (template with a ``Slot`` for
    each operand, output metas, promoted dtype), the dtypes of its Python scalar operands, and
    the lowering checked abstractly."""
    counter = [0]
    scal = []
    slot_metas = []
    vp, vk = info.value_pos, info.value_kw
    targs = tuple(_template(a, counter, i in vp, scal, slot_metas) for i, a in enumerate(args))
    tkw = {}
    for k, v in (kwargs or {}).items():
        t = _template(v, counter, k in vk, scal, slot_metas)
        if not (info.kind == "out" and k in info.written):  # an out= tensor: an operand (the warm
            tkw[k] = t                                     # path passes it), not an argument
    if info.random:
        tkw["__seed__"] = Slot(counter[0])
        counter[0] += 1
        slot_metas.append(TensorMeta((), torch.int64))
    template = (targs, tuple(sorted(tkw.items())))
    if info.kind == "inplace":
        out_metas = [TensorMeta.of(args[0])]
    else:
        out_metas = [TensorMeta(o.shape, o.dtype, o.stride()) for o in outs]
    tensors = flat_tensors(list(args), [])
    sdt = {slot_i: _scalar_dtype(pytype, tensors) for slot_i, pytype in scal}
    sig = OpSig(op_info(target).name, target, low, template, out_metas, cdtype=_promoted(list(args), tensors))
    pattern = None
    if isinstance(mout, (tuple, list)) and any(o is None for o in mout):
        pattern = tuple(o is not None for o in mout)
    for i, dt in sdt.items():
        slot_metas[i] = TensorMeta((), dt)
    _check_lowering(sig, slot_metas, info, args, where)
    return Entry(sig, "node", sdt, nops=counter[0], pattern=pattern)


def _dtype_name(dt):
    return {torch.float32: "Float", torch.float64: "Double", torch.int64: "Long", torch.int32: "Int",
            torch.bool: "Bool", torch.float16: "Half", torch.bfloat16: "BFloat16"}.get(dt, str(dt))


def _check_inplace(func, args, kwargs, where, info, outs):
    """An in-place op must keep its target's shape and dtype: PyTorch's own meta kernel of
    the in-place op says whether the result (``outs``: the functional op's) can be cast back. Ops that change the tensor's
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
                           f"({TensorMeta.of(target)!r} -> {TensorMeta.of(margs[0])!r}) at {fmt_where(where)}; use the "
                           f"out-of-place op instead")
    if outs and not torch.can_cast(outs[0].dtype, target.dtype):
        raise LazyXlaError(f"{info.name}: result type {_dtype_name(outs[0].dtype)} can't be cast to the "
                           f"desired output type {_dtype_name(target.dtype)} at {fmt_where(where)}")


def _check_lowering(sig, slot_metas, info, args, where):
    """Trace the lowering once, abstractly, when a signature is first seen: an op the
    lowering cannot do fails here, at the user's line, not later inside a whole program.
    With the persistent cache on, a check that passed in an earlier process is remembered
    there (keyed by the signature, its inputs and the lowering code) and not traced again."""
    pcache = persistent_cache.get_cache()
    key = _check_key(sig, slot_metas) if pcache is not None else None
    if key is not None and pcache.was_checked(key):
        return
    try:
        _trace_lowering(sig, [(m.shape, jnp_dtype(m.dtype)) for m in slot_metas])
    except Exception as e:  # noqa: BLE001 - every failure becomes the user's error
        shapes = ", ".join(describe(a) for a in args if isinstance(a, (torch.Tensor, list, tuple)))
        msg = str(e).split("\n")[0]
        raise LazyXlaError(f"{info.name}({shapes}) is not supported by lazyxla: {type(e).__name__}: {msg} "
                           f"at {fmt_where(where)}") from None
    if key is not None:
        pcache.remember_checked(key)


def _trace_lowering(sig, shapes_dtypes):
    """The lowering traced on abstract values: in JAX's trace kept open between checks
    (``jax_internals.trace_abstractly``; GPT-2 124M's first step's 167 checks took 0.23-0.28 s
    on this project's 2-core CPU, 0.30-0.49 s through ``jax.eval_shape``), or through
    ``jax.eval_shape`` where JAX's internals are not those lazyxla was checked against. (On a
    TPU the attention's check is the splash kernel's first trace: most of the 171 checks'
    1.7-1.9 s on a v5e's host, 0.12 s without the kernels.)"""
    fn = lambda *v: lowering.lower_call(sig, v)  # noqa: E731
    try:
        return jax_internals.trace_abstractly(fn, shapes_dtypes)
    except jax_internals.JaxInternalsChanged:
        return jax.eval_shape(fn, *[jax.ShapeDtypeStruct(s, d) for s, d in shapes_dtypes])


def _check_key(sig, slot_metas) -> bytes:
    """What a signature check depends on, folded: the signature (op, parameters, outputs),
    its promoted dtype, its lowering function, the shapes and dtypes of its inputs, and the
    lowering code itself with the JAX and lazyxla versions (any change checks again)."""
    low = sig.lower
    name = f"{getattr(low, '__module__', '')}.{getattr(low, '__qualname__', type(low).__name__)}"
    return fold(b"lowering-check", _lowering_fingerprint(), sig.hb, encode(str(sig.cdtype)), encode(name),
                *[m.hash for m in slot_metas])


@functools.lru_cache(maxsize=1)
def _lowering_fingerprint() -> bytes:
    """The lowering package's source, JAX's version and lazyxla's, folded."""
    parts = [encode(jax.__version__), encode(__version__)]
    root = os.path.dirname(lowering.__file__)
    for name in sorted(os.listdir(root)):
        if name.endswith(".py"):
            with open(os.path.join(root, name), "rb") as f:
                parts.append(encode(name) + fold(f.read()))
    return fold(*parts)


def _promoted(args, tensors):
    try:
        vals = [a for a in args if isinstance(a, torch.Tensor) or type(a) in SCALAR_TYPES]
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
    if pytype is complex:  # the tensors' complex dtype, or the one of their floating dtype
        cx = [t.dtype for t in tensors if t.dtype.is_complex]
        if cx:
            return cx[0]
        fl = [t.dtype for t in tensors if t.dtype.is_floating_point]
        return torch.complex128 if (fl[0] if fl else torch.get_default_dtype()) == torch.float64 else torch.complex64
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


def describe(a):
    if is_lazy(a):
        return repr(TensorMeta.of(a))
    if isinstance(a, torch.Tensor):
        return f"{a.dtype}{list(a.shape)}@{a.device}"
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(describe(x) for x in a) + "]"
    return repr(a)



def _returns(func) -> str:
    """How an op returns its tensors: "one", "list" (Tensor[]) or "tuple"."""
    rs = func._schema.returns
    if len(rs) == 1:
        return "list" if str(rs[0].type).startswith("List") else "one"
    return "tuple"

