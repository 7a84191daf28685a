"""The lowering registries: which ATen op lowers to which JAX function, and how.

``register`` fills them (every family module imports it from here, never from the package):
``LOWERINGS`` (op -> lowering), ``RANDOM`` (ops that receive the step's seed),
``STATIC_ARGS`` (scalar arguments hashed into the node), ``ZERO_D_AS_VECTOR`` (ops run on
0-d operands as 1-element vectors), ``PLATFORMS`` (ops lowered on some platforms only) and
``NATIVE_FLOAT64`` (ops whose calls of some float widths are lowered only where the device
computes float64 natively);
``shape_rule`` fills ``SHAPE_RULES`` (output shapes of ops PyTorch has no meta kernel for); ``output_dtypes`` fills ``OUTPUT_DTYPES`` (the CPU kernel's
output dtypes where its meta kernel says others). ``DECOMPOSITIONS`` holds PyTorch's decomposition table,
loaded when this module is imported (``amp`` adds the gradient scaler's two ops to it).
``functional_of`` finds the functional overload behind an in-place or out= op.

May touch: nothing but these registries. Imports no other lazyxla module.
"""
from __future__ import annotations

import torch
from torch._decomp import decomposition_table
from torch._ops import OpOverload, OpOverloadPacket

aten = torch.ops.aten

LOWERINGS: dict = {}
RANDOM: set = set()
DECOMPOSITIONS: dict = {}
# Scalar arguments that decide what the op computes (not just a value in it): they are
# hashed into the node and reach the lowering as Python numbers, never as device data.
STATIC_ARGS: dict = {}
# Ops that take a dim and treat a 0-d tensor as a 1-element vector (PyTorch allows dim 0 or
# -1 there; JAX has no axis on a 0-d array): lower_call runs them on shape (1,) operands and
# reshapes the results back. The value says which operands: "input", "index" (the first
# and the index), "all" (input, index and source).
ZERO_D_AS_VECTOR: dict = {}
# Shape rules of ops PyTorch has no meta kernel for (on meta tensors it raises
# NotImplementedError): ``rule(*args, **kwargs)``, called with the op's arguments as meta
# tensors, returns its result as meta tensors with the shapes, dtypes and strides PyTorch's
# CPU kernel gives. A rule raises NotImplementedError when those depend on the values (the
# CPU computes the op), and PyTorch's error for a call PyTorch refuses. PyTorch's own meta
# kernel, where there is one, comes first.
SHAPE_RULES: dict = {}
# Output dtypes where PyTorch's CPU kernel and its meta kernel disagree (the CPU keeps a norm's
# saved statistics in a half-precision input's dtype, the meta kernel says float32):
# ``rule(*args, **kwargs)``, called with the op's arguments, returns a dtype per output (None:
# the meta kernel's). The node's outputs take them; the program casts its results to them.
OUTPUT_DTYPES: dict = {}
# Ops whose lowering compiles on some platforms only: op -> the platforms (``jax.Device``'s
# ``platform``). Elsewhere ``get`` says there is none, and the op runs on the CPU (R1.7,
# counted as ``aten::<op>``), as torch_xla's TPU runs what XLA has no kernel for.
PLATFORMS: dict = {}
# Ops whose lowering is wrong, or does not compile, in float64 where the device emulates it (a
# TPU keeps float64 as two float32s: ``xla.widths.FLOAT64_NATIVE``): a call with a float64 or
# complex128 input or output gets no lowering there (``get``), and runs on the CPU as
# ``aten::<op>``, with eager's values (a v5e's float64 eigh: NaN eigenvectors; hash_tensor of
# float64: the pair's bits are not IEEE's; LU: float32 and complex64 only). op -> the call
# widths this holds for: ``{"float64"}``, or ``{"float32", "float64"}`` for a lowering that
# computes float32 in float64 (the special functions: a v5e compiled their float32 program in
# emulated float64 for 81 s, and bessel_j0, airy_ai, erfcx, digamma ... came out wrong).
NATIVE_FLOAT64: dict = {}
_FLOAT64, _FLOAT64_WORK = frozenset({"float64"}), frozenset({"float32", "float64"})
# Ops whose lowering compiles on some platforms only for some calls: op -> ``rule(platform,
# args, kwargs)``, whether this call's lowering compiles there (a TPU has no pivoted QR, so
# lstsq's gelsy driver runs on the CPU there, its other drivers on the chip). As PLATFORMS.
CALL_PLATFORMS: dict = {}


def _resolve(op):
    if isinstance(op, OpOverload):
        return [op]
    if isinstance(op, OpOverloadPacket):
        return [getattr(op, o) for o in op.overloads()]
    if isinstance(op, str):
        name, _, ov = op.partition(".")
        packet = getattr(aten, name)
        if ov == "*":
            return [getattr(packet, o) for o in packet.overloads()]
        return [getattr(packet, ov or "default")]
    raise TypeError(op)


def register(*ops, random=False, static=(), zero_d=None, platforms=None, native_float64=False, compiles=None):
    """Decorator: ``@register("add.Tensor", aten.sub.Tensor, ..., static=("ord",))``;
    ``platforms``: where the lowering compiles, when not everywhere (``PLATFORMS``);
    ``compiles``: ``rule(platform, args, kwargs)``, for calls that compile on some platforms
    only (``CALL_PLATFORMS``);
    ``native_float64``: ``True``: a float64 call lowered only where float64 is native;
    ``"float32"``: float32 calls too, whose work is float64 (``NATIVE_FLOAT64``)."""
    def deco(fn):
        for op in ops:
            for o in _resolve(op):
                LOWERINGS[o] = fn
                if platforms is not None:
                    PLATFORMS[o] = frozenset(platforms)
                if compiles is not None:
                    CALL_PLATFORMS[o] = compiles
                if native_float64:
                    NATIVE_FLOAT64[o] = _FLOAT64_WORK if native_float64 == "float32" else _FLOAT64
                if random:
                    RANDOM.add(o)
                if static:
                    STATIC_ARGS[o] = frozenset(static)
                if zero_d:
                    ZERO_D_AS_VECTOR[o] = zero_d
        return fn
    return deco


def shape_rule(*ops):
    """Decorator: ``@shape_rule("geqrf.default")`` on ``rule(*meta_args, **meta_kwargs)``."""
    def deco(fn):
        for op in ops:
            for o in _resolve(op):
                SHAPE_RULES[o] = fn
        return fn
    return deco


def output_dtypes(*ops):
    """Decorator: ``@output_dtypes("native_layer_norm.default")`` on ``rule(*args, **kwargs)``."""
    def deco(fn):
        for op in ops:
            for o in _resolve(op):
                OUTPUT_DTYPES[o] = fn
        return fn
    return deco


def get(func, platform=None, emulated_float64=frozenset(), call=None):
    """``func``'s lowering, or None; with ``platform``, None where it does not compile there
    (``PLATFORMS``); with ``emulated_float64`` (on a device that emulates float64, the call's
    float widths: ``"float64"`` for a float64 or complex128 input or output, ``"float32"``),
    None for ``NATIVE_FLOAT64``'s ops where it names one of them; with ``call`` (its
    ``(args, kwargs)``), None where ``CALL_PLATFORMS``' rule says it does not compile."""
    only = PLATFORMS.get(func)
    if only is not None and platform is not None and platform not in only:
        return None
    rule = CALL_PLATFORMS.get(func)
    if rule is not None and platform is not None and call is not None and not rule(platform, *call):
        return None
    if emulated_float64 and not emulated_float64.isdisjoint(NATIVE_FLOAT64.get(func, ())):
        return None
    return LOWERINGS.get(func)


def is_random(func) -> bool:
    return func in RANDOM


_FUNCTIONAL: dict = {}


def _writes(f):
    return [a.name for a in f._schema.arguments if a.alias_info is not None and a.alias_info.is_write]


_VIEWS: dict = {}


def is_view(func: OpOverload) -> bool:
    """Whether an ATen op is a view: its schema writes no argument and returns an alias of one
    (``t``, ``transpose``, ``view``, ``select``; not ``add_``, whose result aliases what it writes)."""
    v = _VIEWS.get(func)
    if v is None:
        v = _VIEWS[func] = not _writes(func) and any(r.alias_info is not None for r in func._schema.returns)
    return v


def functional_of(func: OpOverload):
    """The functional overload behind an in-place (``add_``) or out= (``add.out``) op, or None."""
    if func in _FUNCTIONAL:
        return _FUNCTIONAL[func]
    s = func._schema
    name = s.name.split("::", 1)[1]
    if name.endswith("_") and not name.endswith("__"):
        packet = getattr(aten, name[:-1], None)
        wanted = _arguments(s.arguments)
        f = getattr(packet, s.overload_name or "default", None) if packet is not None else None
        # The same overload name usually takes the same arguments, but not always: pow_.Scalar
        # takes (Tensor self, Scalar exponent), pow.Scalar (Scalar self, Tensor exponent), and
        # transpose_ (default) is transpose.int. Failing that, the overload with the same arguments.
        same = f is not None and not _writes(f) and _arguments(f._schema.arguments) == wanted
        r = f if same else _overload_taking(packet, wanted)
    else:
        written = set(_writes(func))
        r = _overload_taking(getattr(aten, name, None),
                             _arguments([a for a in s.arguments if a.name not in written]))
    _FUNCTIONAL[func] = r
    return r


def _arguments(args):
    """Names and types of schema arguments, alias annotations left out (``Tensor(a!)`` is ``Tensor``)."""
    return [(a.name, str(a.real_type)) for a in args]


def _overload_taking(packet, wanted):
    """The overload of ``packet`` that writes nothing and takes exactly these arguments."""
    for ov in packet.overloads() if packet is not None else ():
        f = getattr(packet, ov)
        if not _writes(f) and _arguments(f._schema.arguments) == wanted:
            return f
    return None


def _load_decompositions():
    for op, fn in decomposition_table.items():
        if isinstance(op, OpOverload) and op.namespace == "aten":
            DECOMPOSITIONS[op] = fn


_load_decompositions()
