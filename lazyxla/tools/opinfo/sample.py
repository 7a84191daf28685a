"""One sample of an OpInfo: eager on the CPU (a sample eager rejects is skipped; one that reaches a
seeded-random op is passed over), then the same call with every tensor on the lazy device, the
results read back in one ``read_values`` and compared (``compare``: float32 to rtol 1e-4, atol
1e-5, NaN equal to NaN; beyond that the lazy value must be no farther than eager's from a
float64 run; integers, bools and Python scalars exactly; outputs PyTorch leaves open, such as
the order of tied elements or an eigenvector's sign, by ``TIES``), and the ``aten::*`` counters
that moved.

Touches the lazy device's counters and seeds.
"""
from __future__ import annotations

import functools
import os

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ... import metrics
from ...engine.executor import read_values
from ...frontend.tensor import LazyTensor


# Arguments PyTorch wants on the CPU whatever the device (``args`` positions after the input).
CPU_ARGS = {"tensor_split": (0,)}

TOLERANCES = {torch.float16: (1e-2, 1e-2), torch.bfloat16: (1.6e-2, 1e-2),
              torch.float32: (1e-4, 1e-5), torch.complex64: (1e-4, 1e-5),
              torch.float64: (1e-7, 1e-7), torch.complex128: (1e-7, 1e-7)}


class RandomSample(Exception):
    """A sample's eager run reached a seeded-random ATen op."""


class Rejected(Exception):
    """Eager CPU rejects the sample: not a sample."""


class _SeededWatch(torch.utils._python_dispatch.TorchDispatchMode):
    """Notes whether an ATen op tagged ``nondeterministic_seeded`` runs."""

    hit = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
            self.hit = True
        return func(*args, **(kwargs or {}))


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


def first_line(e: BaseException) -> str:
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


_PKG = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the lazyxla package
_OWN = os.path.dirname(os.path.abspath(__file__))  # this checker (tools/opinfo): its own frames are not lazyxla's


def _lazyxla_in(e: BaseException) -> bool:
    """The exception comes from lazyxla (a frame of the package, or its device module)."""
    if "_DeviceModule" in str(e) or "lazyxla" in str(e):
        return True
    tb = e.__traceback__
    while tb is not None:
        f = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if f.startswith(_PKG + os.sep) and not f.startswith(_OWN + os.sep):
            return True
        tb = tb.tb_next
    return False


def check_sample(opinfo, sample, dev, grad=False):
    """``(moved, problem)`` for one sample (``problem`` None if it matches); raises
    Rejected if eager rejects the sample, RandomSample if eager reaches a seeded-random op. With
    ``grad``, the inputs' gradients are compared (``_gradients``), not the outputs."""
    call = functools.partial(_gradients, process=sample.output_process_fn_grad) if grad else _call
    inp = (sample.input, tuple(sample.args), dict(sample.kwargs))
    keep = CPU_ARGS.get(opinfo.name, ())
    lazy_args = tuple(_OnCpu(a) if i in keep and isinstance(a, torch.Tensor) else a
                      for i, a in enumerate(inp[1]))
    try:  # before eager: an in-place op changes its inputs
        lazy_inp, moving = tree_map(_to_lazy(dev), (inp[0], lazy_args, inp[2])), None
    except Exception as e:  # lazyxla's problem if eager accepts the sample
        lazy_inp, moving = None, "moving the inputs to the device: " + first_line(e)
    watch = _SeededWatch()
    try:
        with watch:
            want = call(opinfo, tree_map(_clone, inp))
    except _NoGradient:
        raise Rejected("no input requires a gradient, or no output is differentiable")
    except Exception as e:
        if watch.hit:
            raise RandomSample()
        if _lazyxla_in(e):  # eager CPU broken by lazyxla being imported: lazyxla's error
            return {}, "eager CPU fails with lazyxla imported: " + first_line(e)
        raise Rejected(first_line(e))
    if watch.hit:
        raise RandomSample()
    if moving is not None:
        return {}, moving
    c0 = _aten_counters()
    try:
        got = call(opinfo, lazy_inp)
        lazies = [t for t in tree_flatten(got)[0] if isinstance(t, LazyTensor)]
        hosts = read_values([t._state for t in lazies]) if lazies else []
    except Exception as e:
        return _moved(c0, _aten_counters()), first_line(e)
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
