"""How wide the device holds PyTorch's 64-bit integers: 64 bits, or 32 (``long_bits()``).

A TPU has no 64-bit integer arithmetic. XLA's TPU compiler splits every ``s64`` value of a
program into a pair of 32-bit values before its other passes run. GPT-2 124M's training step
held ~220 of them: token ids, labels, positions, and the index arithmetic of masks and of the
loss. Compiled ahead of time for a v5e on a 2-core machine, the split made the program 1.45x as
large after XLA's passes (34.8k instructions against 24.0k) and its compile 12-22 s longer; on
the chip itself the same run measured no difference (XLA's compile 43.4 s at 32 bits, 42.8 at
64, 2026-12-07), nor in the step. Some programs compile only at 32 bits there (an SVD's 64-bit
loop counters beside float64 made XLA's rewriting fail). JAX holds integers in 32 bits unless
told otherwise; torch_xla does so with ``XLA_USE_32BIT_LONG=1``.

``RULES`` gives each platform's width. torch_xla's ``XLA_USE_32BIT_LONG`` overrides it on every
platform: ``1`` holds int64 in 32 bits, ``0`` in 64. Held in 32 bits, an int64 tensor is still
int64 to PyTorch: its dtype, type promotion, and what ``.cpu()`` returns. On the device it is
int32. Its programs are traced in JAX's 32-bit mode (``scope``), so that no ``s64`` is left in
them, unless ``traced_narrow`` says a program needs 64 bits: a float64 or complex128 argument or
result, any float64 where float64 is native (``FLOAT64_NATIVE``), a uint64, a tensor of 2**31
elements or more, or a lowering that asks for a 64-bit integer itself.

Exact or an error, never a wrapped value:
- an upload or a Python scalar outside int32's range is an error (``check_host``,
  ``check_scalar``);
- an op whose int64 result can leave the range (``WRAPS``: sums, products, powers, shifts,
  conversions from floating point) reports a value check (``lowering.program``). Its result is
  computed again in float32 and must agree; reading it otherwise raises, naming the op and the
  user's line. ``LAZYXLA_CHECK_VALUES=0`` turns these checks off with the others.

The random ops' seed chain wraps at 32 bits here, as it wraps at 64 elsewhere: another stream of
numbers, as on any other platform.

Touches: nothing but its own setting (read once per process).
"""
from __future__ import annotations

import contextlib
import functools

import jax
import numpy as np

from .jax_internals import explicit_x64_allowed

from ..config import env_str

# platform -> bits of an int64 on the device, and why
RULES = {
    "tpu": (32, "no 64-bit integer unit: every s64 is split in two (GPT-2's program 1.45x as large "
                "after XLA's passes; some programs compile only at 32 bits), as JAX holds them"),
    "cpu": (64, "64-bit integers are native; the values are PyTorch's CPU's at every width"),
    "gpu": (64, "64-bit integer arithmetic exists (slower than 32-bit); not measured"),
}

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1

# platform -> whether float64 arithmetic is native there. A TPU emulates it with pairs of
# float32s, and its compiler cannot rewrite every program that holds it (an SVD's loop with
# float64 tolerances: "UNIMPLEMENTED: While rewriting computation to not contain X{64|128}");
# a lowering computes in float64 for accuracy only where ``float64_native()``.
FLOAT64_NATIVE = {"tpu": False, "cpu": True, "gpu": True}

# The ops whose int64 result can leave int32's range when its operands are inside it: each
# reports a value check where int64 is held in 32 bits (``lowering.program.check_wrap``). The
# others cannot leave it: comparisons, min/max, indexing, bitwise and/or/xor, right shifts,
# remainders, sorts, argmax and the like (their results are operands' values or sizes).
WRAPS = frozenset({
    "aten::add.Tensor", "aten::add.Scalar", "aten::sub.Tensor", "aten::sub.Scalar",
    "aten::rsub.Tensor", "aten::rsub.Scalar", "aten::mul.Tensor", "aten::mul.Scalar",
    "aten::neg", "aten::abs", "aten::square",
    "aten::sum", "aten::sum.dim_IntList", "aten::nansum", "aten::prod", "aten::prod.dim_int",
    "aten::cumsum", "aten::cumprod",
    "aten::pow.Tensor_Tensor", "aten::pow.Scalar", "aten::pow.Tensor_Scalar",
    "aten::mm", "aten::bmm", "aten::mv", "aten::dot", "aten::addmm", "aten::baddbmm", "aten::addmv",
    "aten::__lshift__.Tensor", "aten::__lshift__.Scalar",
    "aten::bitwise_left_shift.Tensor", "aten::bitwise_left_shift.Tensor_Scalar",
    "aten::lcm", "aten::index_add", "aten::scatter_add",
    "aten::_to_copy", "aten::copy", "prims::convert_element_type", "lazyxla::convert",
})

_VAR = "XLA_USE_32BIT_LONG"


@functools.lru_cache(maxsize=1)
def long_bits() -> int:
    """How many bits this process's device holds an int64 in: 32 or 64 (``RULES``, or
    ``XLA_USE_32BIT_LONG``)."""
    v = env_str("XLA_USE_32BIT_LONG").strip().lower()
    if v in ("1", "true", "yes", "on"):
        return 32
    if v in ("0", "false", "no", "off"):
        return 64
    if v:
        raise ValueError(f"{_VAR}={v!r}: 1 holds int64 in 32 bits on the device, 0 in 64 (unset: the "
                         f"platform's rule, lazyxla.xla.widths.RULES)")
    return RULES.get(_platform(), (64, ""))[0]


def long_dtype():
    """The JAX dtype a lowering names for PyTorch's int64 (an index, a count, a position, an
    int64 result): int32 inside a 32-bit trace (``scope``), int64 otherwise. Asked for by name as
    ``jnp.int64``, the value would keep 64 bits in that trace and send the whole program to the
    64-bit trace (``holds_int64``): every ``s64`` split in two on a TPU, seconds more to compile.
    A lowering whose value needs 64 bits whatever the width (a hash's bits) names ``jnp.int64``."""
    return jax.dtypes.canonicalize_dtype(np.int64)


def float64_native() -> bool:
    """Whether this process's device computes float64 natively (``FLOAT64_NATIVE``)."""
    return FLOAT64_NATIVE.get(_platform(), False)


def _platform() -> str:
    """This process's device's platform (``client.jax_device``'s: its first local device)."""
    return jax.local_devices()[0].platform


def narrow() -> bool:
    """Whether int64 is held in 32 bits."""
    return long_bits() == 32


_ADVICE = f"set {_VAR}=0 to hold int64 in 64 bits (slower to compile and to run on a TPU)"


def range_text(what: str) -> str:
    return (f"{what} outside -2**31 .. 2**31-1, the range this device holds int64 in "
            f"({_VAR}, lazyxla.xla.widths); {_ADVICE}")


def check_host(arr: np.ndarray) -> np.ndarray:
    """An int64 array as the device holds it: int32, or an OverflowError when a value does not
    fit (the caller adds where it came from)."""
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < INT32_MIN or hi > INT32_MAX:
            bad = hi if hi > INT32_MAX else lo
            raise OverflowError(range_text(f"an int64 tensor holds {bad},"))
    return arr.astype(np.int32)


def check_scalar(value: int) -> None:
    """A Python int an int64 operand takes: an OverflowError when it does not fit."""
    if value < INT32_MIN or value > INT32_MAX:
        raise OverflowError(range_text(f"the int64 scalar {value} is"))


# dtypes whose programs are traced with JAX's 64-bit defaults where float64 is native: there a
# lowering's implicit float64 constant (a NumPy float64 scalar) keeps its digits. Where float64
# is emulated (a TPU) a program that holds them inside, not among its arguments or results, is
# traced in 32-bit mode too: the float64 values a lowering or PyTorch asks for explicitly stay float64 (PyTorch's pinv takes its tolerances as float64
# tensors), and an SVD's loop counters are not 64-bit integers, which XLA's TPU compiler could
# not rewrite next to them ("UNIMPLEMENTED: While rewriting computation to not contain X{64|128}").
_WIDE_FLOATS = frozenset({"torch.float64", "torch.complex128"})


def emulated_widths(dtypes) -> frozenset:
    """Where float64 is emulated, which of ``"float64"`` (float64, complex128) and ``"float32"`` a
    call's values (their torch dtypes) hold; empty where float64 is native (the lowering
    registry's ``NATIVE_FLOAT64`` rules read it)."""
    if float64_native():
        return frozenset()
    names = {str(d) for d in dtypes}
    return frozenset(w for w, held in (("float64", not names.isdisjoint(_WIDE_FLOATS)),
                                       ("float32", "torch.float32" in names)) if held)


def traced_narrow(metas, io=()) -> bool:
    """Whether a program is traced in JAX's 32-bit mode: int64 held in 32 bits, and none of its
    values (TensorMetas: ``shape``, ``dtype``, ``numel``) needs 64 bits: a uint64; a float64 or
    complex128 where float64 is native, and on any platform among its arguments and results
    ``io`` (JAX's 32-bit mode compiles a float64 argument as float32); 2**31 elements or more,
    whose flat indices need 64 bits."""
    if not narrow():
        return False
    for m in io:
        if str(m.dtype) in _WIDE_FLOATS or str(m.dtype) == "torch.uint64":
            return False
    native = float64_native()
    for m in metas:
        d = str(m.dtype)
        if d == "torch.uint64" or (native and d in _WIDE_FLOATS) or m.numel > INT32_MAX:
            return False
    return True


_INT64 = (np.dtype(np.int64), np.dtype(np.uint64))


def holds_int64(jaxpr) -> bool:
    """Whether a traced program (a ClosedJaxpr, with the jaxprs of its loops and calls) holds a
    64-bit integer: a lowering asked for one explicitly. JAX's 32-bit mode does not keep such a
    value apart from its 32-bit defaults everywhere (``jax.random.randint`` to int64 drew 11 from
    [3, 11)), so that program is traced again without it."""
    seen = set()
    todo = [jaxpr]
    while todo:
        j = todo.pop()
        j = getattr(j, "jaxpr", j)  # a ClosedJaxpr's Jaxpr
        if id(j) in seen or not hasattr(j, "eqns"):
            continue
        seen.add(id(j))
        for v in list(j.invars) + list(j.constvars):
            if getattr(v.aval, "dtype", None) in _INT64:
                return True
        for e in j.eqns:
            for v in e.outvars:
                if getattr(v.aval, "dtype", None) in _INT64:
                    return True
            for p in e.params.values():
                if hasattr(p, "eqns") or hasattr(p, "jaxpr"):
                    todo.append(p)
                elif isinstance(p, (tuple, list)):
                    todo.extend(x for x in p if hasattr(x, "eqns") or hasattr(x, "jaxpr"))
    return False


@contextlib.contextmanager
def scope(narrow_trace: bool):
    """A program's trace, in JAX's 32-bit mode where ``narrow_trace`` (``traced_narrow``). JAX's
    defaults are then 32-bit (an ``arange``'s or ``argmax``'s integers, a Python int's type)
    while a lowering's explicit 64-bit dtype is kept (``jax_explicit_x64_dtypes``: the float64
    inside special functions). Where that trace fails (a lowering whose explicit int64 meets a
    32-bit default inside JAX, a constant that int32 cannot hold) or holds a 64-bit integer
    (``holds_int64``), the compiler traces the program again without it: its int64 values
    still 32 bits, its lowerings' own 64-bit values checked on their way into them
    (``lowering.program``)."""
    if not narrow_trace:
        yield
        return
    with jax.enable_x64(False), explicit_x64_allowed():
        yield
