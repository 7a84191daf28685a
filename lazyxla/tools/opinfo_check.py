"""The OpInfo figure: PyTorch's OpInfo database run op by op on the lazy device.

Where ``coverage.verify`` checks core ATen ops one by one, this checks the ops a user calls
(``torch.cumsum``, ``F.conv2d``, ``torch.linalg.solve``, ``x[m]``, ...): every OpInfo of
``torch.testing._internal.common_methods_invocations.op_db`` that supports float32 on the CPU
and is not random, on the first ``samples`` (3) of
``opinfo.sample_inputs("cpu", torch.float32)``, in ``op_db``'s order, seeds fixed.

Not random means none of:
- the name is a random op (``RANDOM_NAME``, as ``torch.X`` or ``torch.nn.functional.X``:
  ``rand*``, ``normal``, ``bernoulli``, ``multinomial``, ``uniform``, ``exponential``,
  ``geometric``, ``cauchy``, ``log_normal``, ``poisson``, the dropouts (``dropout``,
  ``dropout2d/3d``, ``alpha_dropout``, ``feature_alpha_dropout``), ``rrelu``,
  ``fractional_max_pool2d/3d``, ``svd_lowrank``, ``pca_lowrank``; not
  ``signal.windows.exponential``, ``nn.functional.normalize``, ``poisson_nll_loss`` or
  ``native_dropout_backward``, which are deterministic);
- ``opinfo.has_nondeterministic_output`` (``empty`` and friends: values unspecified);
- the eager CPU run of every one of its samples reaches an ATen op tagged
  ``torch.Tag.nondeterministic_seeded`` (a safety net for random ops the names miss; a single
  random sample, such as attention with ``dropout_p > 0``, is passed over for the next one).
Those are listed as excluded and left out of the count.

Per sample: eager on the CPU (a sample eager rejects is skipped), then the same call with
every tensor moved to ``lazyxla.device()`` (and ``device="cpu"`` arguments pointed at it;
``CPU_ARGS``: the few tensor arguments PyTorch wants on the CPU on any device stay there),
the results read back in one ``read_values``, compared with ``torch.testing.assert_close``
(float32 to rtol 1e-4, atol 1e-5, NaN equal to NaN; where they differ beyond that the lazy
value must be no farther than eager's from a float64 run: ill-conditioned samples; integers,
bools and Python scalars exactly), and the ``aten::*`` counters that moved are noted. The
runner reads through ``read_values``, never ``.item()``, so an ``aten::_local_scalar_dense``
that moves is a value read the op itself made (``equal``, ``allclose``, a Python-side
``.item()`` or ``.tolist()``): it counts as falling back to the host.

Per OpInfo the status is ``ok`` (every sample matches, no ``aten::*`` counter moved),
``fallback`` (matches, but an ``aten::*`` counter moved), ``wrong`` (a value, shape, dtype or
output count differs), ``error`` (lazyxla raised where eager did not; eager CPU raised only
because lazyxla is imported (a lazyxla frame or ``torch.lazyxla`` in the error); the op ran
past its time limit, ``--time-limit``, 60 s), ``refused`` (every problem is lazyxla's own
error for an input it does not support on purpose, ``REFUSED``: sparse layouts) or
``no-sample`` (no sample eager accepts). A
wrong sample outranks an error, an error a fallback. The first problem is kept. One op never
stops the run: each sample's failure is caught, and pending IR is synced and garbage collected
after each OpInfo.

``lazyxla coverage --opinfo [--ops NAME,...] [--samples 3] [--json FILE] [--markdown FILE]``
prints the table and the totals line; ``docs/opinfo.md`` is its ``--markdown`` page. Needs
``expecttest`` (PyTorch's OpInfo database imports it). Touches the lazy device's counters,
compilation cache and seeds; the CPU RNG state is restored.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import gc
import itertools
import json
import os
import re
import signal
import sys
import threading
import time
import warnings

import jax
import torch
from torch.utils._pytree import tree_flatten, tree_map

from .. import manual_seed, metrics, sync
from ..frontend.device import device
from ..engine.executor import read_values
from ..frontend.tensor import LazyTensor

STATUSES = ("ok", "fallback", "wrong", "error", "refused", "no-sample")

# What lazyxla refuses on purpose, with a LazyXlaError that says so: XLA has dense arrays only,
# so sparse layouts (COO, CSR, ...) are not kept on the device (torch_xla has none either).
REFUSED = re.compile(r"^LazyXlaError: .*does not support torch\.sparse_\w+ tensors")

RANDOM_NAME = re.compile(r"^(nn\.functional\.)?(rand\w*|normal|bernoulli|multinomial|\w*dropout(\dd)?|uniform"
                         r"|exponential|geometric|cauchy|log_normal|poisson|rrelu|fractional_max_pool\dd"
                         r"|svd_lowrank|pca_lowrank)$")

# Why an aten::* counter moves: the value-dependent ops stay on the host on purpose.
VALUE_DEPENDENT = {
    "aten::nonzero": "output shape is the number of nonzero elements",
    "aten::argwhere": "output shape is the number of nonzero elements",
    "aten::masked_select": "output shape is the number of true mask elements",
    "aten::index": "boolean-mask indexing: output shape is the number of true mask elements",
    "aten::_unique2": "output shape is the number of distinct values",
    "aten::unique_dim": "output shape is the number of distinct values",
    "aten::unique_consecutive": "output shape is the number of runs",
    "aten::repeat_interleave": "with repeats as a tensor, output shape is the sum of the repeats",
    "aten::equal": "the result is a Python bool: a value read",
    "aten::allclose": "the result is a Python bool: a value read",
}
# A value read inside the op or its decomposition (``.item()``): on purpose where the op's
# result is a Python value or it checks the values (as PyTorch's own code does), not otherwise.
VALUE_READS = {
    "aten::_local_scalar_dense": "a value read (`.item()`) in the op or its decomposition",
    "aten::item": "a value read (`.item()`, or indexing with a 0-dim tensor) in the op or its decomposition",
}

# Arguments PyTorch wants on the CPU whatever the device (``args`` positions after the input).
CPU_ARGS = {"tensor_split": (0,)}

TOLERANCES = {torch.float16: (1e-2, 1e-2), torch.bfloat16: (1.6e-2, 1e-2),
              torch.float32: (1e-4, 1e-5), torch.complex64: (1e-4, 1e-5),
              torch.float64: (1e-7, 1e-7), torch.complex128: (1e-7, 1e-7)}

# The dtypes ``--dtype`` takes by name, and the modes a whole run is made of (``MODES``: every
# dtype the issue-31 table covers, and float32 autograd).
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "complex64": torch.complex64, "int32": torch.int32,
          "int64": torch.int64, "uint8": torch.uint8, "bool": torch.bool}
MODES = ("float32", "float32-grad", "float64", "float16", "bfloat16", "complex64", "int32", "int64", "bool")


def parse_mode(mode: str):
    """``(dtype, grad)`` of a mode name: a dtype (``bfloat16``) or ``float32-grad`` (autograd:
    the gradients of every input that requires one, for a fixed cotangent, are compared)."""
    name, grad = (mode[:-len("-grad")], True) if mode.endswith("-grad") else (mode, False)
    if name not in DTYPES:
        raise ValueError(f"lazyxla coverage --opinfo: unknown dtype {name!r}; one of {', '.join(DTYPES)} "
                         f"(a floating one may end in -grad)")
    if grad and not DTYPES[name].is_floating_point:
        raise ValueError(f"lazyxla coverage --opinfo: {mode}: gradients need a floating dtype")
    return DTYPES[name], grad


@dataclasses.dataclass
class OpResult:
    name: str
    status: str  # one of STATUSES
    samples: int = 0  # samples eager accepted (compared or failed on the lazy device)
    counters: dict = dataclasses.field(default_factory=dict)  # aten::* counter -> times moved
    problem: str = ""  # the first problem, if any
    seconds: float = 0.0

    def record(self) -> dict:
        return dataclasses.asdict(self)


class _Random(Exception):
    """A sample's eager run reached a seeded-random ATen op."""


class _Rejected(Exception):
    """Eager CPU rejects the sample: not a sample."""


class _TimeLimit(BaseException):
    """The op ran past its time limit (a BaseException: the op's own handlers keep out)."""


class _SeededWatch(torch.utils._python_dispatch.TorchDispatchMode):
    """Notes whether an ATen op tagged ``nondeterministic_seeded`` runs."""

    hit = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
            self.hit = True
        return func(*args, **(kwargs or {}))


def full_name(opinfo) -> str:
    return opinfo.name + ("." + opinfo.variant_test_name if opinfo.variant_test_name else "")


def _op_db():
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except ImportError as e:  # PyTorch's test helpers need expecttest
        raise ImportError(f"lazyxla coverage --opinfo needs PyTorch's OpInfo database ({e}); "
                          "pip install expecttest (lazyxla's test extra)") from e
    return op_db


def select(names=None, dtype=torch.float32, grad=False):
    """``(opinfos, excluded)``: the OpInfos to run for ``dtype`` on the CPU (with ``grad``: those
    whose backward supports it), in ``op_db``'s order, and ``{name: reason}`` for those left out
    as random (by name or nondeterministic output). ``names``: OpInfo names (``div`` takes every
    variant, ``div.trunc_rounding`` one)."""
    chosen, excluded = [], {}
    want = None if names is None else set(names)
    for o in _op_db():
        n = full_name(o)
        if want is not None and not (o.name in want or n in want):
            continue
        try:
            if dtype not in o.supported_dtypes("cpu"):
                continue
            if grad and not (o.supports_autograd and dtype in o.supported_backward_dtypes("cpu")):
                continue
        except Exception:
            continue
        if RANDOM_NAME.match(o.name):
            excluded[n] = "random (by name)"
        elif getattr(o, "has_nondeterministic_output", False):
            excluded[n] = "nondeterministic output (values unspecified)"
        else:
            chosen.append(o)
    return chosen, excluded


# ---------------------------------------------------------------------------------------
# One sample.
class _OnCpu:
    """A tensor argument that stays on the CPU (``CPU_ARGS``)."""

    def __init__(self, t):
        self.t = t


def _clone(x):
    return x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x


def _to_lazy(dev):
    def f(x):
        if isinstance(x, _OnCpu):
            return x.t
        if isinstance(x, torch.Tensor):
            return x.detach().to(dev).requires_grad_(x.requires_grad)
        if (isinstance(x, torch.device) and x.type == "cpu") or (isinstance(x, str) and x == "cpu"):
            return dev
        return x
    return f


def _upcast(x):
    if isinstance(x, torch.Tensor):
        if x.dtype in (torch.float32, torch.float16, torch.bfloat16):
            return x.detach().double().requires_grad_(x.requires_grad)
        if x.dtype == torch.complex64:
            return x.detach().to(torch.complex128).requires_grad_(x.requires_grad)
        return x.detach().clone().requires_grad_(x.requires_grad)
    return x


def _to_meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta").requires_grad_(x.requires_grad)
    if (isinstance(x, torch.device) and x.type == "cpu") or (isinstance(x, str) and x == "cpu"):
        return torch.device("meta")
    return x


def _outputs(opinfo, inp, call):
    """The op's outputs (or gradients), flattened, on ``inp`` (None if it raises)."""
    try:
        return tree_flatten(call(opinfo, inp))[0]
    except Exception:
        return None


def _call(opinfo, inp):
    i, a, k = inp
    return opinfo(i, *a, **k)


class _NoGradient(Exception):
    """The sample has no input that requires a gradient, or no differentiable output."""


def _cotangent(t, i):
    """A fixed cotangent for output ``i``: the same numbers for eager and the lazy device, in
    [-1, 1), made without a random op (the seeded-random watch would take the sample for one)."""
    n = torch.arange(t.numel(), dtype=torch.float64)
    v = ((n * 0.7548776662466927 + 0.5698402909980532 * (i + 1)) % 1.0) * 2 - 1
    if t.is_complex():
        v = torch.complex(v, ((n * 0.5698402909980532 + 0.31 * (i + 1)) % 1.0) * 2 - 1)
    return v.to(t.dtype).reshape(t.shape).to(t.device)


def _gradients(opinfo, inp, process=None):
    """The gradient of every input that requires one (None where unused), for fixed cotangents of
    the op's floating outputs: what ``backward()`` gives a user. ``process``: the sample's
    ``output_process_fn_grad`` (PyTorch's own: it makes outputs that are unique only up to a sign
    or phase, such as eigenvectors, comparable)."""
    out = _call(opinfo, inp)
    if process is not None:
        out = process(out)
    outs = [t for t in tree_flatten(out)[0]
            if isinstance(t, torch.Tensor) and t.requires_grad and (t.is_floating_point() or t.is_complex())]
    leaves = [t for t in tree_flatten(inp)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    if not outs or not leaves:
        raise _NoGradient()
    cts = [_cotangent(t, i) for i, t in enumerate(outs)]
    return list(torch.autograd.grad(outs, leaves, cts, allow_unused=True))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".strip()


def _no_worse(g, w, r, rtol, atol) -> bool:
    """Where lazy and eager differ, lazy is at least as close to the float64 result."""
    if not isinstance(r, torch.Tensor) or r.shape != w.shape:
        return False
    if not (w.dtype.is_floating_point or w.dtype.is_complex):
        return False
    r = r.to(torch.complex128 if r.is_complex() else torch.float64)
    eg, ew = (g.to(r.dtype) - r).abs(), (w.to(r.dtype) - r).abs()
    ew = torch.where(ew.isnan() & ~r.isnan(), torch.inf, ew)  # eager NaN where the reference is a number
    ok = (eg <= ew + atol + rtol * r.abs()) | (g.isnan() & r.isnan()) | (g == r)
    return bool(ok.all())


def compare(got, want, rtol, atol, ref64=None, meta=None):
    """Raises AssertionError naming the first output that differs.

    ``ref64``: the float64 outputs, for ill-conditioned samples; ``meta``: the meta kernel's
    outputs. A lazy output with the meta kernel's shape where PyTorch's CPU kernel gives
    another is not compared; its dtype must be eager's."""
    gl, _ = tree_flatten(got)
    wl, _ = tree_flatten(want)
    if len(gl) != len(wl):
        raise AssertionError(f"{len(gl)} outputs, eager has {len(wl)}")
    for i, (g, w) in enumerate(zip(gl, wl)):
        if isinstance(w, torch.Tensor):
            if not isinstance(g, torch.Tensor):
                raise AssertionError(f"output {i}: {type(g).__name__}, eager has a tensor")
            if g.dtype != w.dtype:
                raise AssertionError(f"output {i}: {g.dtype}{list(g.shape)}, eager {w.dtype}{list(w.shape)}")
            if tuple(g.shape) != tuple(w.shape):
                m = meta[i] if meta is not None and i < len(meta) else None
                if isinstance(m, torch.Tensor) and tuple(m.shape) == tuple(g.shape):
                    continue
                raise AssertionError(f"output {i}: {g.dtype}{list(g.shape)}, eager {w.dtype}{list(w.shape)}")
            if w.layout != torch.strided or not w.numel():
                continue
            exact = not (w.dtype.is_floating_point or w.dtype.is_complex)
            # the inputs' tolerance, or the output dtype's where it is wider (a half-precision factory)
            rt, at = (0.0, 0.0) if exact else max((rtol, atol), TOLERANCES.get(w.dtype, (0.0, 0.0)))
            try:
                torch.testing.assert_close(g, w, rtol=rt, atol=at, equal_nan=True, check_device=False,
                                           check_stride=False, check_layout=False,
                                           msg=lambda m, i=i: f"output {i}: " + "; ".join(
                                               x.strip() for x in m.splitlines() if x.strip()))
            except AssertionError:
                r = ref64[i] if ref64 is not None and i < len(ref64) else None
                if exact or not _no_worse(g, w, r, rtol, atol):
                    raise
        elif isinstance(w, float) and isinstance(g, float) and w != w and g != g:
            continue
        elif type(g) is not type(w) or g != w:
            raise AssertionError(f"output {i}: {g!r}, eager {w!r}")


def _tolerances(inp):
    dts = {t.dtype for t in tree_flatten(inp)[0] if isinstance(t, torch.Tensor)}
    tols = [TOLERANCES[d] for d in dts if d in TOLERANCES]
    return max(tols) if tols else TOLERANCES[torch.float32]


def _aten_counters():
    return {n: metrics.counter_value(n) for n in metrics.counter_names() if n.startswith("aten::")}


def _moved(before, after):
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the lazyxla package


def _lazyxla_in(e: BaseException) -> bool:
    """The exception comes from lazyxla (a frame of the package, or its device module)."""
    if "_DeviceModule" in str(e) or "lazyxla" in str(e):
        return True
    tb = e.__traceback__
    while tb is not None:
        f = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if f.startswith(_PKG + os.sep) and f != os.path.abspath(__file__):
            return True
        tb = tb.tb_next
    return False


def check_sample(opinfo, sample, dev, grad=False):
    """``(moved, problem)`` for one sample (``problem`` None if it matches); raises
    _Rejected if eager rejects the sample, _Random if eager reaches a seeded-random op. With
    ``grad``, the inputs' gradients are compared (``_gradients``), not the outputs."""
    call = functools.partial(_gradients, process=sample.output_process_fn_grad) if grad else _call
    inp = (sample.input, tuple(sample.args), dict(sample.kwargs))
    keep = CPU_ARGS.get(opinfo.name, ())
    lazy_args = tuple(_OnCpu(a) if i in keep and isinstance(a, torch.Tensor) else a
                      for i, a in enumerate(inp[1]))
    try:  # before eager: an in-place op changes its inputs
        lazy_inp, moving = tree_map(_to_lazy(dev), (inp[0], lazy_args, inp[2])), None
    except Exception as e:  # lazyxla's problem if eager accepts the sample
        lazy_inp, moving = None, "moving the inputs to the device: " + _first_line(e)
    watch = _SeededWatch()
    try:
        with watch:
            want = call(opinfo, tree_map(_clone, inp))
    except _NoGradient:
        raise _Rejected("no input requires a gradient, or no output is differentiable")
    except Exception as e:
        if watch.hit:
            raise _Random()
        if _lazyxla_in(e):  # eager CPU broken by lazyxla being imported: lazyxla's error
            return {}, "eager CPU fails with lazyxla imported: " + _first_line(e)
        raise _Rejected(_first_line(e))
    if watch.hit:
        raise _Random()
    if moving is not None:
        return {}, moving
    c0 = _aten_counters()
    try:
        got = call(opinfo, lazy_inp)
        lazies = [t for t in tree_flatten(got)[0] if isinstance(t, LazyTensor)]
        hosts = read_values([t._state for t in lazies]) if lazies else []
    except Exception as e:
        return _moved(c0, _aten_counters()), _first_line(e)
    moved = _moved(c0, _aten_counters())
    table = {id(t): h for t, h in zip(lazies, hosts)}
    got = tree_map(lambda x: table.get(id(x), x) if isinstance(x, LazyTensor) else x, got)
    if not grad and opinfo.name in TIES:
        got = TIES[opinfo.name](inp, got, want)
    rtol, atol = _tolerances(inp)
    try:
        try:
            compare(got, want, rtol, atol)
        except AssertionError:
            compare(got, want, rtol, atol, _reference(opinfo, inp, call),
                    _outputs(opinfo, tree_map(_to_meta, inp), call))
    except AssertionError as e:
        return moved, "wrong: " + (str(e).strip().splitlines() or [""])[0]
    return moved, None


# Outputs PyTorch leaves open: an index among equal values (an unstable sort's order of
# equivalent elements; which of tied elements topk picks), an eigenvector's sign or phase. A
# lazy output that is an equally valid answer (selects the same values from the input; solves
# the eigenproblem) counts as eager's. Each rule takes (inputs, lazy
# outputs, eager outputs) and returns the lazy outputs, with eager's indices where the lazy ones
# are an equally valid answer.
def _same(a, b) -> bool:
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan()) if a.is_floating_point() else a == b).all())


def _picks(x, dim, idx, values) -> bool:
    """``idx`` along ``dim`` picks ``values`` out of ``x``, each element at most once."""
    if x.ndim == 0:
        return _same(x, values) and bool((idx == 0).all())
    if idx.dtype != torch.int64 or idx.numel() and (idx.min() < 0 or idx.max() >= x.shape[dim]):
        return False
    picked = torch.take_along_dim(x, idx, dim)
    s = idx.sort(dim).values
    distinct = s.shape[dim] < 2 or bool((s.narrow(dim, 1, s.shape[dim] - 1) != s.narrow(dim, 0, s.shape[dim] - 1)).all())
    return _same(picked, values) and distinct


def _sort_args(inp):
    _, a, k = inp
    dim = a[0] if len(a) > 0 else k.get("dim", -1)
    return dim, bool(k.get("stable", False))


def _ties_sort(inp, got, want):
    dim, stable = _sort_args(inp)
    if stable or not (isinstance(got, tuple) and len(got) == 2):
        return got
    if _same(got[0], want[0]) and _picks(inp[0], dim, got[1], got[0]):
        return (got[0], want[1])
    return got


def _ties_argsort(inp, got, want):
    dim, stable = _sort_args(inp)
    if stable or not isinstance(got, torch.Tensor):
        return got
    x = inp[0]
    ordered = torch.take_along_dim(x, want, dim) if x.ndim else x
    return want if _picks(x, dim, got, ordered) else got


def _ties_topk(inp, got, want):
    x, a, k = inp
    dim = a[1] if len(a) > 1 else k.get("dim", -1)
    if isinstance(got, tuple) and len(got) == 2 and _same(got[0], want[0]) and _picks(x, dim, got[1], got[0]):
        return (got[0], want[1])
    return got


def _eigenvectors(a, got, want):
    """Eigenvectors are unique only up to a sign (eigh) or a complex phase (eig), which LAPACK
    builds differ in: lazy ones that are unit columns solving ``a v = lambda v`` (with eager's
    eigenvalues) count as eager's."""
    if not (isinstance(got, tuple) and len(got) == 2 and got[1].shape == want[1].shape) or not got[1].numel():
        return got
    wide = torch.complex128 if (got[1].is_complex() or want[1].is_complex() or a.is_complex()) else torch.float64
    a, lam, v = a.to(wide), want[0].to(wide), got[1].to(wide)
    real = got[1].real if got[1].is_complex() else got[1]
    eps = torch.finfo(real.dtype).eps
    scale = a.abs().amax(dim=(-2, -1), keepdim=True).clamp_min(1.0) * a.shape[-1]
    residual = (a @ v - v * lam.unsqueeze(-2)).abs().amax(dim=(-2, -1), keepdim=True)
    unit = bool(((v.abs().square().sum(-2).sqrt() - 1).abs() <= 100 * eps).all())
    if unit and bool((residual <= 100 * eps * scale).all()):
        return (got[0], want[1])
    return got


def _ties_eig(inp, got, want):
    return _eigenvectors(inp[0], got, want)


def _ties_eigh(inp, got, want):
    a = inp[0]
    upper = (inp[1][0] if inp[1] else inp[2].get("UPLO", "L")) == "U"
    tri = a.triu() + a.triu(1).mH if upper else a.tril() + a.tril(-1).mH   # eigh reads one triangle
    if tri.is_complex():  # and the real part of the diagonal
        d = tri.diagonal(dim1=-2, dim2=-1)
        tri = tri - torch.diag_embed(d - d.real)
    return _eigenvectors(tri, got, want)


TIES = {"sort": _ties_sort, "argsort": _ties_argsort, "topk": _ties_topk,
        "linalg.eig": _ties_eig, "linalg.eigh": _ties_eigh}


def _reference(opinfo, inp, call):
    """The more exact result the lazy value may be closer to than eager's: the op in float64
    (complex128) for narrower inputs; for float64 inputs, the OpInfo's NumPy/SciPy reference
    (``opinfo.ref``) where it has one, on a plain unary or binary call."""
    wide = any(isinstance(t, torch.Tensor) and t.dtype in (torch.float64, torch.complex128)
               for t in tree_flatten(inp)[0])
    if not wide:
        return _outputs(opinfo, tree_map(_upcast, inp), call)
    ref = getattr(opinfo, "ref", None)
    if ref is None or call is not _call or inp[2]:
        return None
    try:
        import numpy as np
        args = [t.detach().numpy() if isinstance(t, torch.Tensor) else t for t in (inp[0], *inp[1])]
        return [torch.from_numpy(np.asarray(ref(*args)))]
    except Exception:
        return None


# ---------------------------------------------------------------------------------------
# One OpInfo.
class _Alarm:
    """Raises _TimeLimit in the main thread after ``seconds`` (no-op elsewhere or if 0)."""

    def __init__(self, seconds):
        self.seconds = seconds if threading.current_thread() is threading.main_thread() else 0
        self.old = None

    def _fire(self, *_):
        raise _TimeLimit()

    def __enter__(self):
        if self.seconds and hasattr(signal, "setitimer"):
            self.old = signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.old)
        return False


def check_opinfo(opinfo, samples: int = 3, time_limit: float = 60.0, dtype=torch.float32, grad=False):
    """The ``OpResult`` of one OpInfo on its first ``samples`` samples of ``dtype`` that are not
    random (a sample that reaches a random op, such as attention with ``dropout_p > 0``, is
    passed over), or ``None`` if every sample was random. ``grad``: compare gradients."""
    name = full_name(opinfo)
    dev = device()
    t0 = time.monotonic()
    counters = collections.Counter()
    problems, wrong, rejected, accepted, random_samples = [], [], [], 0, 0
    try:
        with _Alarm(time_limit), torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            manual_seed(0)
            try:
                it = opinfo.sample_inputs("cpu", dtype, requires_grad=grad)
                batch = list(itertools.islice(it, 4 * samples))
            except Exception as e:
                return OpResult(name, "no-sample", problem="sample_inputs: " + _first_line(e),
                                seconds=time.monotonic() - t0)
            for s in batch:
                if accepted + len(rejected) == samples:
                    break
                try:
                    r = check_sample(opinfo, s, dev, grad)
                except _Random:  # a random sample (dropout_p > 0): the next one instead
                    random_samples += 1
                    continue
                except _Rejected as e:
                    rejected.append(str(e))
                    continue
                except Exception as e:  # a problem of the runner's own (never of the op)
                    r = {}, "runner: " + _first_line(e)
                accepted += 1
                moved, problem = r
                counters.update(moved)
                if problem is not None:
                    (wrong if problem.startswith("wrong: ") else problems).append(problem)
    except _TimeLimit:
        problems.append(f"time limit: over {time_limit:g} s (after {accepted} samples)")
    finally:
        try:
            sync()  # no pending IR piles up from one op to the next
        except Exception:
            pass
        gc.collect()
    secs = time.monotonic() - t0
    counters = dict(sorted(counters.items()))
    if wrong:
        return OpResult(name, "wrong", accepted, counters, wrong[0][len("wrong: "):], secs)
    if problems:
        refused = all(REFUSED.match(p) for p in problems)
        return OpResult(name, "refused" if refused else "error", accepted, counters, problems[0], secs)
    if not accepted and random_samples and not rejected:
        return None
    if not accepted:
        why = f"eager rejects every sample ({rejected[0]})" if rejected else "no samples"
        return OpResult(name, "no-sample", 0, {}, why, secs)
    return OpResult(name, "fallback" if counters else "ok", accepted, counters, "", secs)


def run(names=None, samples: int = 3, time_limit: float = 60.0, progress=None, mode: str = "float32"):
    """``(results, excluded)``: an ``OpResult`` per OpInfo run, ``{name: reason}`` left out;
    ``mode``: a dtype's name, or ``float32-grad`` (``parse_mode``)."""
    dtype, grad = parse_mode(mode)
    opinfos, excluded = select(names, dtype, grad)
    results = []
    for i, o in enumerate(opinfos):
        if progress is not None:
            progress(i, len(opinfos), full_name(o))
        r = check_opinfo(o, samples, time_limit, dtype, grad)
        if r is None:
            excluded[full_name(o)] = "random (every sample reaches a nondeterministic_seeded ATen op)"
        else:
            results.append(r)
    return results, dict(sorted(excluded.items()))


# ---------------------------------------------------------------------------------------
# Reports.
def _sorted(results):
    return sorted(results, key=lambda r: (STATUSES.index(r.status), r.name))


def totals(results) -> dict:
    c = collections.Counter(r.status for r in results)
    return {k: c.get(k, 0) for k in STATUSES}


def totals_line(results, mode: str = "float32") -> str:
    c, n = totals(results), len(results)
    return (f"opinfo{'' if mode == 'float32' else ' ' + mode}: {n} ops, {c['ok']} ok, {c['fallback']} fallback "
            f"({100 * c['fallback'] / n if n else 0.0:.1f}%), {c['wrong']} wrong, {c['error']} error, "
            f"{c['refused']} refused, {c['no-sample']} no-sample")


def _counters_text(counters) -> str:
    return ", ".join(k + (f" x{v}" if v != 1 else "") for k, v in counters.items())


def table(results) -> str:
    w = max([len(r.name) for r in results] + [6])
    lines = [f"{'opinfo':<{w}}  {'status':<9}  detail"]
    for r in _sorted(results):
        detail = "; ".join(x for x in (_counters_text(r.counters), r.problem) if x)
        lines.append(f"{r.name:<{w}}  {r.status:<9}  {' '.join(detail.split())[:200]}")
    return "\n".join(lines)


def by_counter(results) -> dict:
    """``{aten counter: [OpInfo names]}`` for the ops that fell back."""
    out = collections.defaultdict(list)
    for r in _sorted(results):
        if r.status == "fallback":
            for k in r.counters:
                out[k].append(r.name)
    return dict(sorted(out.items(), key=lambda kv: (-len(kv[1]), kv[0])))


def to_json(results, excluded, samples, seconds, mode="float32") -> dict:
    return {"torch": torch.__version__, "jax": jax.__version__, "mode": mode, "samples": samples,
            "seconds": round(seconds, 1), "totals": totals(results), "totals_line": totals_line(results, mode),
            "excluded": excluded, "ops": [r.record() for r in _sorted(results)]}


def _cell(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    if len(text) > limit:
        text = text[:limit - 1].rstrip() + "…"
    return text.replace("|", "\\|")


_PAGE_INTRO = """\
# OpInfo coverage

Generated by `lazyxla coverage --opinfo --markdown docs/opinfo.md` ({versions}; {seconds:.0f} s
on {cpus} cores); regenerate rather than edit. The other engineers' lowerings move this figure:
it is today's.

Every OpInfo of PyTorch's `op_db` that supports float32 on the CPU and is not random, on its
first {samples} float32 samples, run on eager CPU and on `lazyxla.device()`, compared
(`lazyxla/opinfo_check.py` says how). Per OpInfo: *ok* (every sample matches, no `aten::*`
counter moved), *fallback* (matches, but some `aten::*` counter moved: part of the op ran on the
CPU, or the op read a value to the host), *wrong* (a value, shape or dtype differs), *error*
(lazyxla raised where eager did not), *refused* (lazyxla raised, on purpose, the error that
says the input is unsupported: sparse layouts, as XLA keeps dense arrays only), *no-sample*
(eager rejects every sample).

```
{totals}
```

Target (issue 10): at most 5% falling back ({target} of {n}), none wrong, none erroring, and
what stays on the CPU stays there because its output shape or result depends on the values.
Of today's {fallback} falling back, {purpose} do so only through such ops, {reads} through a
value read inside the op (`.item()`: see each), {other} through an op not lowered yet.
"""


def page(results, excluded, samples, seconds) -> str:
    fallback = [r for r in results if r.status == "fallback"]
    purpose = sum(all(k in VALUE_DEPENDENT for k in r.counters) for r in fallback)
    reads = sum(all(k in VALUE_DEPENDENT or k in VALUE_READS for k in r.counters) for r in fallback) - purpose
    parts = [_PAGE_INTRO.format(versions=f"PyTorch {torch.__version__}, JAX {jax.__version__}",
                                seconds=seconds, cpus=os.cpu_count(), samples=samples,
                                totals=totals_line(results), target=int(0.05 * len(results)),
                                n=len(results), purpose=purpose, reads=reads, fallback=len(fallback),
                                other=len(fallback) - purpose - reads)]
    groups = by_counter(results)
    parts.append("## Falling back, by the ATen op that moved\n")
    if groups:
        parts.append("| aten op | why | OpInfos |\n|---|---|---|")
        for k, names in groups.items():
            why = VALUE_DEPENDENT.get(k) or VALUE_READS.get(k, "not lowered yet")
            parts.append(f"| `{k}` | {why} | " + ", ".join(f"`{n}`" for n in names) + " |")
        parts.append("")
    else:
        parts.append("None.\n")
    bad = [r for r in _sorted(results) if r.status in ("wrong", "error", "refused", "no-sample")]
    parts.append("## Wrong, erroring, refused, no sample\n")
    if bad:
        parts.append("| OpInfo | status | first problem |\n|---|---|---|")
        parts.extend(f"| `{r.name}` | {r.status} | {_cell(r.problem)} |" for r in bad)
        parts.append("")
    else:
        parts.append("None.\n")
    parts.append("## Excluded (random or nondeterministic)\n")
    parts.append(", ".join(f"`{n}`" for n in excluded) + "\n" if excluded else "None.\n")
    parts.append("## All OpInfos\n")
    parts.append("| OpInfo | status | aten ops that moved | first problem |\n|---|---|---|---|")
    for r in _sorted(results):
        parts.append(f"| `{r.name}` | {r.status} | {_cell(_counters_text(r.counters))} | {_cell(r.problem)} |")
    return "\n".join(parts) + "\n"


_MODES_INTRO = """\
# OpInfo coverage beyond float32

Generated by `lazyxla coverage --opinfo --dtype {modes} --markdown docs/opinfo_dtypes.md` ({versions};
{seconds:.0f} s on {cpus} cores); regenerate rather than edit.

As `docs/opinfo.md` (float32), for each dtype every OpInfo that supports it on the CPU, on its
first {samples} samples of that dtype; `float32-grad`: every OpInfo whose backward supports
float32, the gradient of each input that requires one for a fixed cotangent of the outputs,
compared with eager's (what `backward()` gives). Values as close as eager's own to the op run in
float64 (for float64: to the OpInfo's NumPy/SciPy reference) count as equal.

| mode | ops | ok | fallback | wrong | error | refused | no-sample |
|---|---|---|---|---|---|---|---|
"""


def modes_page(per_mode: dict, samples, seconds) -> str:
    """The page of several modes: ``per_mode`` is ``{mode: (results, excluded)}``."""
    parts = [_MODES_INTRO.format(modes=",".join(per_mode), seconds=seconds, cpus=os.cpu_count(),
                                 versions=f"PyTorch {torch.__version__}, JAX {jax.__version__}", samples=samples)
             .rstrip("\n")]
    for mode, (results, _) in per_mode.items():
        c = totals(results)
        parts.append(f"| {mode} | {len(results)} | " + " | ".join(str(c[k]) for k in STATUSES) + " |")
    parts.append("")
    for mode, (results, _) in per_mode.items():
        parts.append(f"## {mode}\n")
        bad = [r for r in _sorted(results) if r.status != "ok"]
        if not bad:
            parts.append("Every OpInfo matches eager.\n")
            continue
        parts.append("| OpInfo | status | aten ops that moved | first problem |\n|---|---|---|---|")
        parts.extend(f"| `{r.name}` | {r.status} | {_cell(_counters_text(r.counters))} | {_cell(r.problem)} |"
                     for r in bad)
        parts.append("")
    return "\n".join(parts) + "\n"


def add_arguments(p) -> None:
    """The ``--opinfo`` options of ``lazyxla coverage``."""
    p.add_argument("--opinfo", action="store_true",
                   help="run PyTorch's OpInfo database (float32, CPU, not random) on the lazy device "
                        "and compare with eager CPU; prints the table and the totals line")
    p.add_argument("--ops", metavar="NAME,...",
                   help="with --opinfo: only these OpInfos (a name takes all its variants)")
    p.add_argument("--samples", type=int, default=3, metavar="N",
                   help="with --opinfo: the first N samples of each OpInfo (default 3)")
    p.add_argument("--time-limit", type=float, default=60.0, metavar="S",
                   help="with --opinfo: seconds per OpInfo before it counts as an error (default 60)")
    p.add_argument("--json", metavar="FILE", help="with --opinfo: write the per-op records to FILE")
    p.add_argument("--dtype", default="float32", metavar="MODE,...",
                   help="with --opinfo: the dtypes to run (" + ", ".join(DTYPES) + "), float32-grad for "
                        "gradients, or all (" + ",".join(MODES) + "); default float32")


def main(args) -> int:
    """``lazyxla coverage --opinfo``: the table and the totals line on stdout."""
    names = [n.strip() for n in args.ops.split(",") if n.strip()] if getattr(args, "ops", None) else None

    tty = sys.stderr.isatty()

    def progress(i, n, name):
        if tty:
            print(f"\r[{i + 1}/{n}] {name:<56}", end="", file=sys.stderr, flush=True)
        elif i % 50 == 0:
            print(f"[{i + 1}/{n}] {name} ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
    modes = list(MODES) if args.dtype.strip() == "all" else [m.strip() for m in args.dtype.split(",") if m.strip()]
    for m in modes:
        parse_mode(m)   # an unknown mode fails before anything runs
    per_mode, lines = {}, []
    t0 = time.monotonic()
    for mode in modes:
        m0 = time.monotonic()
        results, excluded = run(names, samples=args.samples, time_limit=args.time_limit, progress=progress,
                                mode=mode)
        per_mode[mode] = (results, excluded)
        if tty:
            print(file=sys.stderr)
        print(table(results))
        if excluded:
            print(f"excluded as random or nondeterministic ({len(excluded)}): " + ", ".join(excluded))
        print(f"took {time.monotonic() - m0:.0f} s")
        lines.append(totals_line(results, mode))
        print(lines[-1])
    seconds = time.monotonic() - t0
    if len(modes) > 1:
        print("\n".join(lines))
    if getattr(args, "json", None):
        with open(args.json, "w") as f:
            records = {m: to_json(r, e, args.samples, seconds, m) for m, (r, e) in per_mode.items()}
            json.dump(records[modes[0]] if len(modes) == 1 else {"modes": records}, f, indent=1)
            f.write("\n")
    if getattr(args, "markdown", None):
        with open(args.markdown, "w") as f:
            if modes == ["float32"]:
                f.write(page(*per_mode["float32"], args.samples, seconds))
            else:
                f.write(modes_page(per_mode, args.samples, seconds))
    return 0
