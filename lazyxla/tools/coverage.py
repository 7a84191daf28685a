"""Which of PyTorch's core ATen ops lazyxla lowers, decomposes or runs on the CPU.

The core ATen op set is every ``torch.ops.aten`` overload tagged ``torch.Tag.core``. Each
is *classified* as the warm path (``tensor.py``, ``ops.py``) handles it, in its own order:

- ``lowered``: a JAX lowering is registered for it (for an in-place or out= variant, for
  its functional op), or ``ops`` handles it itself (aliases, transfers);
- ``composite``: PyTorch's CompositeImplicitAutograd kernel rewrites it into other ops;
- ``decomposed``: a ``torch._decomp`` decomposition rewrites it into other ops;
- ``fallback``: it runs on the CPU, counted as ``aten::<op>`` (R1.7).

``verify`` then *runs* each op on the lazy device and compares with eager CPU. Its inputs
are PyTorch's OpInfo samples (``op_db``), recorded at the ATen level: every sample of an
OpInfo runs on the CPU under a dispatch mode below autograd that keeps the arguments of
each core op it reaches (a composite op is kept, then followed into its decomposition), so
each core op is replayed exactly as PyTorch calls it; backward ops come from a backward
pass. Per op the result is ``ok``, ``fallback`` (an ``aten::*`` counter moved; expected
for ops whose output shape depends on the data), ``error`` (raised, or a wrong value) or
``no-sample``.

``lazyxla coverage [--verify] [--markdown FILE]`` prints the table and the totals;
``--markdown`` writes the whole page (``docs/coverage.md`` is this, with ``--verify``).
``lazyxla coverage --opinfo`` runs whole OpInfos instead (``opinfo_check``, ``docs/opinfo.md``).
Needs ``expecttest`` for ``--verify`` (PyTorch's OpInfo database imports it). Touches the
lazy device's counters and compilation cache, and nothing else (the CPU RNG is restored).
"""
from __future__ import annotations

import collections
import dataclasses
import gc
import sys
import time
import warnings

import jax
import torch
from torch._ops import OpOverload
from torch.utils._pytree import tree_flatten, tree_map

from .. import lowering, metrics
from . import opinfo_check
from ..frontend.device import device
from ..engine.executor import read_values
from ..frontend.ops import SPECIAL
from ..frontend.tensor import LazyTensor

aten = torch.ops.aten

CATEGORIES = ("lowered", "composite", "decomposed", "fallback")
STATUSES = ("ok", "fallback", "error", "no-sample")

# Ops that stay on the CPU on purpose, and why (docs/coverage.md says more).
DATA_DEPENDENT = {
    "nonzero": "output shape is the number of nonzero elements",
    "masked_select": "output shape is the number of true mask elements",
    "unique": "output shape is the number of distinct values",
    "_unique2": "output shape is the number of distinct values",
    "unique_dim": "output shape is the number of distinct values",
    "unique_consecutive": "output shape is the number of runs",
    "argwhere": "output shape is the number of nonzero elements",
    "index": "with a boolean mask (`x[m]`), output shape is the number of true mask elements; "
             "integer indexing is lowered",
}
INHERENT = {
    "_local_scalar_dense": "a value read (`.item()`): the value goes to the host by definition",
}
EXPECTED_FALLBACK = set(DATA_DEPENDENT) | set(INHERENT)

# Outputs whose values are unspecified or random: only shape and dtype are compared.
_NO_VALUES = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"}
# Only the first outputs are compared: the rest are backward workspaces whose contents
# differ between PyTorch's own CPU and CUDA kernels.
_COMPARED_OUTPUTS = {"_embedding_bag": 1}


# ---------------------------------------------------------------------------------------
# The op set and its classification.
def core_ops() -> list:
    """Every core ATen overload (``torch.Tag.core``), sorted by name."""
    packets = sorted({n[len("aten::"):].split(".")[0] for n in torch._C._dispatch_get_all_op_names()
                      if n.startswith("aten::")})
    out = []
    for name in packets:
        packet = getattr(aten, name, None)
        if packet is None:
            continue
        for ov in packet.overloads():
            op = getattr(packet, ov)
            if torch.Tag.core in op.tags:
                out.append(op)
    return out


def op_name(op: OpOverload) -> str:
    """``add.Tensor``, ``relu`` (the default overload without its suffix)."""
    s = op._schema
    base = s.name.split("::", 1)[1]
    return base + ("." + s.overload_name if s.overload_name else "")


def packet_name(op: OpOverload) -> str:
    return op._schema.name.split("::", 1)[1]


def classify(op: OpOverload):
    """``(category, note)`` for one op, following the warm path's order of preference."""
    name = packet_name(op)
    if op in SPECIAL:
        if name in INHERENT:
            return "fallback", INHERENT[name]
        return "lowered", "handled by lazyxla itself"
    writes = any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)
    target = lowering.functional_of(op) if writes else op
    if op in lowering.LOWERINGS or (target is not None and target in lowering.LOWERINGS):
        return "lowered", ""
    if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
        return "composite", ""
    if op in lowering.DECOMPOSITIONS or (target is not None and target in lowering.DECOMPOSITIONS):
        return "decomposed", ""
    return "fallback", DATA_DEPENDENT.get(name) or INHERENT.get(name, "")


def classification(ops=None) -> dict:
    """``{op: (category, note)}`` for ``ops`` (default: all core ops)."""
    return {op: classify(op) for op in (core_ops() if ops is None else ops)}


def counts(classes: dict) -> dict:
    c = collections.Counter(cat for cat, _ in classes.values())
    return {k: c.get(k, 0) for k in CATEGORIES}


def fallback_share(classes: dict) -> float:
    return counts(classes)["fallback"] / max(len(classes), 1)


# ---------------------------------------------------------------------------------------
# Samples: OpInfo inputs recorded at the ATen level.
@dataclasses.dataclass
class Sample:
    op: OpOverload
    args: tuple
    kwargs: dict
    source: str  # the OpInfo (or "handmade")


def _detach_clone(x):
    if isinstance(x, torch.Tensor):
        return x.detach().contiguous().clone()
    return x


def _meta_key(args, kwargs):
    """A hashable description of a call (shapes, dtypes, scalars) to skip duplicates."""
    def k(x):
        if isinstance(x, torch.Tensor):
            return ("T", tuple(x.shape), x.dtype)
        if isinstance(x, (list, tuple)):
            return tuple(k(y) for y in x)
        if isinstance(x, dict):
            return tuple(sorted((a, k(b)) for a, b in x.items()))
        return repr(x)
    return (k(args), k(kwargs))


class _Recorder(torch.utils._python_dispatch.TorchDispatchMode):
    """Keeps the arguments of the wanted ops; follows composite ops into their parts."""

    def __init__(self, want: dict, per_op: int, source: str):
        super().__init__()
        self.want, self.per_op, self.source = want, per_op, source
        self.seen = collections.defaultdict(set)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        store = self.want.get(func)
        if store is not None and len(store) < self.per_op:
            key = _meta_key(args, kwargs)
            if key not in self.seen[func]:
                self.seen[func].add(key)
                store.append(Sample(func, tree_map(_detach_clone, tuple(args)),
                                    tree_map(_detach_clone, dict(kwargs)), self.source))
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            with self:
                r = func.decompose(*args, **kwargs)
            if r is not NotImplemented:
                return r
        return func(*args, **kwargs)


def _pick_dtype(opinfo):
    try:
        dts = opinfo.supported_dtypes("cpu")
    except Exception:
        return None
    for d in (torch.float32, torch.int64, torch.int32, torch.bool, torch.float64, torch.complex64):
        if d in dts:
            return d
    return next(iter(dts), None)


def _short(opinfo):
    return opinfo.name + ("." + opinfo.variant_test_name if opinfo.variant_test_name else "")


def _run_opinfo(opinfo, want, per_op, backward, deadline):
    dtype = _pick_dtype(opinfo)
    if dtype is None:
        return
    grad = backward and dtype.is_floating_point and getattr(opinfo, "supports_autograd", False)
    if backward and not grad:
        return
    try:
        samples = opinfo.sample_inputs("cpu", dtype, requires_grad=grad)
    except Exception:
        return
    rec = _Recorder(want, per_op, _short(opinfo))
    for n, s in enumerate(samples):
        if n >= 2 * per_op or time.monotonic() > deadline:
            break
        try:
            if not grad:
                with torch._C._AutoDispatchBelowAutograd(), rec:
                    opinfo(s.input, *s.args, **s.kwargs)
            else:
                with rec:
                    out = opinfo(s.input, *s.args, **s.kwargs)
                    outs = [o for o in tree_flatten(out)[0]
                            if isinstance(o, torch.Tensor) and o.requires_grad]
                    ins = [t for t in tree_flatten((s.input, s.args, s.kwargs))[0]
                           if isinstance(t, torch.Tensor) and t.requires_grad]
                    if outs and ins:
                        loss = sum(o.float().sum() if not o.is_complex() else o.abs().sum() for o in outs)
                        torch.autograd.grad(loss, ins, allow_unused=True)
        except Exception:
            continue


def _norm(name):
    for p in ("nn.functional.", "_refs.", "special.", "linalg.", "fft."):
        if name.startswith(p):
            name = name[len(p):]
    return name


def _handmade():
    """Inputs for core ops that no OpInfo reaches (size queries and friends)."""
    x = torch.randn(3, 4)
    i = torch.randint(-9, 9, (3, 4))
    b, w, bias = torch.randn(4, 3, 5), torch.randn(3), torch.randn(3)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    return {
        aten.sym_size.int: [((x, 1), {})],
        aten.sym_stride.int: [((x, 0), {})],
        aten.sym_numel.default: [((x,), {})],
        aten.sym_storage_offset.default: [((x,), {})],
        aten.sym_is_contiguous.default: [((x,), {})],
        aten.resize_.default: [((torch.randn(6), [6]), {}), ((torch.randn(6), [2, 3]), {})],
        aten._local_scalar_dense.default: [((torch.tensor(2.5),), {})],
        aten.empty.memory_format: [(([2, 3],), {"dtype": torch.float32, "device": torch.device("cpu")})],
        aten.empty_strided.default: [(([2, 3], [3, 1]), {"dtype": torch.float32,
                                                        "device": torch.device("cpu")})],
        aten.alias.default: [((x,), {})],
        aten.copy.default: [((x, torch.randn(4)), {})],
        aten.atan2.out: [((x, torch.randn(3, 4)), {"out": torch.empty(3, 4)})],
        aten.scalar_tensor.default: [((3.5,), {"dtype": torch.float32})],
        aten.randperm.default: [((7,), {"dtype": torch.int64})],
        aten.rand.default: [(([2, 3],), {"dtype": torch.float32})],
        aten.randn.default: [(([2, 3],), {"dtype": torch.float32})],
        aten.native_dropout.default: [((torch.randn(4, 5), 0.5, True), {})],
        aten.bitwise_and.Scalar: [((i, 6), {})],
        aten.bitwise_or.Scalar: [((i, 6), {})],
        aten.bitwise_xor.Scalar: [((i, 6), {})],
        aten.div.Scalar_mode: [((x, 0.7), {"rounding_mode": "floor"}), ((i, 3), {"rounding_mode": "trunc"})],
        aten.fmod.Scalar: [((x, 0.7), {}), ((i, 3), {})],
        aten._native_batch_norm_legit.no_stats: [((b, w, bias, True, 0.1, 1e-5), {})],
        aten._native_batch_norm_legit_no_training.default: [((b, w, bias, rm, rv, 0.1, 1e-5), {})],
        aten.reflection_pad1d.default: [((b, [1, 2]), {})],
        aten.reflection_pad2d.default: [((torch.randn(2, 3, 4, 5), [1, 2, 2, 1]), {})],
        aten.reflection_pad3d.default: [((torch.randn(2, 3, 4, 5, 3), [1, 2, 2, 1, 0, 2]), {})],
        aten.replication_pad2d.default: [((torch.randn(2, 3, 4, 5), [1, 2, 2, 1]), {})],
        aten.replication_pad3d.default: [((torch.randn(2, 3, 4, 5, 3), [1, 2, 2, 1, 0, 2]), {})],
    }


def collect_samples(ops, per_op: int = 8, opinfos=None, time_budget: float = 600.0) -> dict:
    """``{op: [Sample]}``: up to ``per_op`` distinct calls of each op from OpInfo samples.

    ``opinfos``: OpInfo names to draw from (default: all of ``op_db``, ops' namesakes first).
    """
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except ImportError as e:  # PyTorch's test helpers need expecttest
        raise ImportError(f"lazyxla coverage --verify needs PyTorch's OpInfo database ({e}); "
                          "pip install expecttest (lazyxla's test extra)") from e
    want = {op: [] for op in ops}
    deadline = time.monotonic() + time_budget
    packets = {packet_name(op) for op in ops}
    if opinfos is not None:
        names = set(opinfos)
        pool = [o for o in op_db if o.name in names or _short(o) in names]
    else:
        pool = list(op_db)
    first = [o for o in pool if _norm(o.name) in packets or o.aten_name in packets]
    rest = [o for o in pool if not (_norm(o.name) in packets or o.aten_name in packets)]
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        torch.manual_seed(0)
        warnings.simplefilter("ignore")
        _collect(first, rest, want, per_op, deadline)
        for op, calls in _handmade().items():
            if op in want and not want[op]:
                want[op] = [Sample(op, a, k, "handmade") for a, k in calls]
    return want


def _collect(first, rest, want, per_op, deadline):
    for backward in (False, True):
        for group in (first, rest):
            for oi in group:
                if time.monotonic() > deadline:
                    break
                if all(len(v) >= per_op for v in want.values()):
                    break
                if group is rest and all(v for v in want.values()):
                    break
                _run_opinfo(oi, want, per_op, backward, deadline)


# ---------------------------------------------------------------------------------------
# Verification: run each sample on the lazy device, compare with eager CPU.
@dataclasses.dataclass
class Verified:
    status: str  # ok | fallback | error | no-sample
    samples: int = 0
    detail: str = ""
    counters: tuple = ()  # aten::* counters that moved
    sources: tuple = ()  # the OpInfos (or "handmade") the samples came from


def _fallback_counters():
    return {n: metrics.counter_value(n) for n in metrics.counter_names() if n.startswith("aten::")}


def _to_lazy(x, dev):
    if isinstance(x, torch.Tensor):
        return x.to(dev)
    if isinstance(x, torch.device) and x.type == "cpu":
        return dev
    return x


def _data_dependent(op, args, kwargs) -> bool:
    """True when the op's output shape cannot be known without the values."""
    if packet_name(op) in DATA_DEPENDENT:
        return True

    def meta(x):
        if isinstance(x, torch.Tensor):
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        if isinstance(x, torch.device):
            return torch.device("meta")
        return x
    try:
        op(*tree_map(meta, args), **tree_map(meta, kwargs))
    except torch._subclasses.fake_tensor.DynamicOutputShapeException:
        return True
    except Exception as e:
        m = str(e).lower()
        return "data-dependent" in m or "nonzero" in m or "dynamic" in m
    return False


def _no_worse(g, w, r, rtol, atol) -> bool:
    """Where lazy and eager differ, lazy is at least as close to the float64 result."""
    if not isinstance(r, torch.Tensor) or r.shape != w.shape or not w.dtype.is_floating_point:
        return False
    r = r.double()
    eg, ew = (g.double() - r).abs(), (w.double() - r).abs()
    ok = (eg <= ew + atol + rtol * r.abs()) | (g.isnan() & r.isnan())
    return bool(ok.all())


def _reference64(op, sample):
    """The op in float64 on the sample (None if it has no low-precision float input or fails)."""
    leaves = tree_flatten((sample.args, sample.kwargs))[0]
    low = (torch.float32, torch.float16, torch.bfloat16)
    if not any(isinstance(t, torch.Tensor) and t.dtype in low for t in leaves):
        return None

    def up(x):
        return x.detach().double() if isinstance(x, torch.Tensor) and x.dtype in low else _detach_clone(x)
    try:
        return tree_flatten(op(*tree_map(up, sample.args), **tree_map(up, sample.kwargs)))[0]
    except Exception:
        return None


def _compare(op, got, want, rtol, atol, ref64=None) -> list:
    """Raises AssertionError on a difference; returns notes on accepted differences.

    A float difference beyond the tolerances is accepted where the lazy value is no
    farther than eager's from the float64 result ``ref64`` (ill-conditioned samples)."""
    gl, gs = tree_flatten(got)
    wl, ws = tree_flatten(want)
    if len(gl) != len(wl):
        raise AssertionError(f"{len(gl)} outputs, eager has {len(wl)}")
    values = not (packet_name(op) in _NO_VALUES or torch.Tag.nondeterministic_seeded in op.tags)
    notes = []
    for i, (g, w) in enumerate(zip(gl, wl)):
        if i >= _COMPARED_OUTPUTS.get(packet_name(op), len(gl)):
            break
        if isinstance(w, torch.Tensor):
            if not isinstance(g, torch.Tensor):
                raise AssertionError(f"output {i}: {type(g).__name__}, eager has a tensor")
            if g.dtype != w.dtype:
                raise AssertionError(f"output {i}: {g.dtype}{list(g.shape)}, eager {w.dtype}{list(w.shape)}")
            if tuple(g.shape) != tuple(w.shape):
                # A lazy output always has the meta kernel's shape; PyTorch's CPU kernel
                # differs from it for a few outputs (e.g. batch norm's saved statistics).
                notes.append(f"output {i} has the meta kernel's shape, not CPU eager's (not compared)")
                continue
            if values and w.numel():
                try:
                    torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True,
                                               check_device=False, check_stride=False,
                                               msg=lambda m, i=i: f"output {i}: " + "; ".join(
                                                   x.strip() for x in m.splitlines() if x.strip()))
                except AssertionError:
                    r = ref64[i] if ref64 is not None and i < len(ref64) else None
                    if not _no_worse(g, w, r, rtol, atol):
                        raise
        elif values and g != w and not (isinstance(w, float) and w != w and g != g):
            raise AssertionError(f"output {i}: {g!r}, eager {w!r}")
    return notes


def _tolerances(sample):
    dts = {t.dtype for t in tree_flatten((sample.args, sample.kwargs))[0] if isinstance(t, torch.Tensor)}
    if dts & {torch.float16, torch.bfloat16}:
        return 1e-2, 1e-2
    if dts & {torch.float32, torch.complex64}:
        return 1e-4, 1e-5
    return 1e-7, 1e-7


def verify_op(op, samples) -> Verified:
    """Run ``samples`` of one op on the lazy device; compare values and fallback counters."""
    if not samples:
        return Verified("no-sample")
    dev = device()
    before = _fallback_counters()
    expected_fb = packet_name(op) in EXPECTED_FALLBACK
    problems, moved, notes = [], set(), set()
    pending = []
    for s in samples:
        try:
            ref = op(*tree_map(_detach_clone, s.args), **tree_map(_detach_clone, s.kwargs))
        except Exception:
            continue  # PyTorch's own eager rejects the call: not a sample
        c0 = _fallback_counters()
        try:
            got = op(*tree_map(lambda x: _to_lazy(x, dev), s.args),
                     **tree_map(lambda x: _to_lazy(x, dev), s.kwargs))
        except Exception as e:
            problems.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            continue
        c1 = _fallback_counters()
        fb = {k for k in c1 if c1[k] != c0.get(k, 0)}
        if fb:
            moved |= fb
            if not expected_fb and not _data_dependent(op, s.args, s.kwargs):
                problems.append("unexpected CPU fallback: " + ", ".join(sorted(fb)))
        pending.append((s, got, ref))
    if not pending and not problems:
        return Verified("no-sample")
    if pending:
        lazies = [t for _, g, _ in pending for t in tree_flatten(g)[0] if isinstance(t, LazyTensor)]
        try:
            hosts = read_values([t._state for t in lazies]) if lazies else []
        except Exception as e:
            problems.append(f"{type(e).__name__} at execution: {str(e).splitlines()[0] if str(e) else ''}")
            hosts = None
        if hosts is not None:
            table = {id(t): h for t, h in zip(lazies, hosts)}
            for s, g, ref in pending:
                host = tree_map(lambda x: table.get(id(x), x) if isinstance(x, LazyTensor) else x, g)
                rtol, atol = _tolerances(s)
                try:
                    try:
                        notes |= set(_compare(op, host, ref, rtol, atol))
                    except AssertionError:
                        notes |= set(_compare(op, host, ref, rtol, atol, _reference64(op, s)))
                except AssertionError as e:
                    problems.append(f"wrong value ({s.source}): {str(e).splitlines()[0]}")
    del pending
    after = _fallback_counters()
    moved |= {k for k in after if after[k] != before.get(k, 0)}
    n = len(samples)
    src = tuple(dict.fromkeys(s.source for s in samples))
    if problems:
        return Verified("error", n, problems[0], tuple(sorted(moved)), src)
    if moved:
        return Verified("fallback", n, "data-dependent output shape" if not expected_fb else "",
                        tuple(sorted(moved)), src)
    return Verified("ok", n, "; ".join(sorted(notes)), (), src)


def verify(ops=None, per_op: int = 8, opinfos=None, time_budget: float = 600.0, progress=None) -> dict:
    """``{op: Verified}``: each op run on its OpInfo samples (see the module docstring)."""
    ops = core_ops() if ops is None else list(ops)
    samples = collect_samples(ops, per_op=per_op, opinfos=opinfos, time_budget=time_budget)
    out = {}
    for i, op in enumerate(ops):
        if progress is not None:
            progress(i, len(ops), op)
        out[op] = verify_op(op, samples.get(op, []))
        if out[op].status == "error":
            gc.collect()  # tensors held by the exception's frames
    return out


# ---------------------------------------------------------------------------------------
# Reports.
def summary(classes: dict, verified=None) -> str:
    c = counts(classes)
    n = len(classes)
    lines = [f"{n} core ATen ops: " + ", ".join(f"{c[k]} {k} ({100 * c[k] / max(n, 1):.1f}%)"
                                                for k in CATEGORIES)]
    lines.append(f"without CPU fallback: {n - c['fallback']} of {n} "
                 f"({100 * (n - c['fallback']) / max(n, 1):.1f}%)")
    if verified:
        v = collections.Counter(r.status for r in verified.values())
        m = len(verified)
        lines.append(f"verified on OpInfo samples ({m} ops): " + ", ".join(
            f"{v.get(k, 0)} {k} ({100 * v.get(k, 0) / max(m, 1):.1f}%)" for k in STATUSES))
    return "\n".join(lines)


def markdown(classes: dict, verified=None) -> str:
    """The per-op table."""
    if verified:
        head = "| op | handled | verified | samples from | note |\n|---|---|---|---|---|"
    else:
        head = "| op | handled | note |\n|---|---|---|"
    rows = []
    for op in sorted(classes, key=op_name):
        cat, note = classes[op]
        v = verified.get(op) if verified else None
        if v is None:
            if verified:
                rows.append(f"| `{op_name(op)}` | {cat} |  |  | {_cell(note)} |")
            else:
                rows.append(f"| `{op_name(op)}` | {cat} | {_cell(note)} |")
            continue
        bits = [x for x in (", ".join(f"`{c}`" for c in v.counters), v.detail) if x]
        note = "; ".join([x for x in (note, *bits) if x])
        src = ", ".join(v.sources)
        rows.append(f"| `{op_name(op)}` | {cat} | {v.status} | {_cell(src)} | {_cell(note)} |")
    return head + "\n" + "\n".join(rows) + "\n"


def _cell(text: str, limit: int = 240) -> str:
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[:limit - 1].rstrip() + "…"
    return text.replace("|", "\\|")


_PAGE_INTRO = """\
# Core ATen op coverage

Generated by `lazyxla coverage --verify --markdown docs/coverage.md` ({versions});
regenerate rather than edit. The op set is every `torch.ops.aten` overload tagged
`torch.Tag.core`: the ops PyTorch's compilers and exporters decompose everything else into.

Whole ops as a user calls them (`torch.cumsum`, `F.conv2d`, `torch.linalg.solve`, `x[m]`: every
float32 OpInfo of PyTorch's `op_db`), eager CPU against the lazy device, are in
[opinfo.md](opinfo.md) (`lazyxla coverage --opinfo --markdown docs/opinfo.md`).

**handled** says what lazyxla's warm path (`lazyxla/frontend/tensor.py`, `lazyxla/frontend/ops.py`) does with the op, in its order of preference:

- *lowered*: a JAX lowering is registered (`lazyxla/lowering/`), or `ops.py` handles the op
  itself (aliases, transfers); an in-place or `out=` variant uses its functional op's lowering;
- *composite*: PyTorch's CompositeImplicitAutograd kernel rewrites it into other ops;
- *decomposed*: a `torch._decomp` decomposition rewrites it into other ops;
- *fallback*: it runs on the CPU (inputs read, result uploaded), counted as `aten::<op>`.

**verified** is the result of running the op on the lazy device with PyTorch's own OpInfo
samples (`op_db`), recorded at the ATen level so each op is called exactly as PyTorch calls
it (a backward pass for backward ops; a few handmade samples where no OpInfo reaches the op),
compared with eager CPU:

- *ok*: every sample matches eager CPU (float32 to rtol 1e-4, atol 1e-5; where a sample is
  ill-conditioned, the lazy value must be no farther than eager's from a float64 run) and
  no `aten::*` fallback counter moved;
- *fallback*: it ran and matched, but through the CPU (the counters that moved are listed);
- *error*: it raised, or a value was wrong;
- *no-sample*: no sample reached the op.
"""

_PAGE_WHY = """\
## Why some ops fall back on purpose

XLA compiles a program for fixed shapes: every array's shape is part of the compiled program
and of its graph hash, and a lazy tensor must know its shape the moment it is recorded (later
ops are shape-checked against it without running anything). A few ops cannot know their
output shape until the values are computed:

- `nonzero(x)`: one row per nonzero element of `x` (also `argwhere`);
- `masked_select(x, m)` and boolean-mask indexing `x[m]`: one element per true element of `m`;
- `unique(x)` (`_unique2`, `unique_dim`, `unique_consecutive`): one element per distinct value.

For these lazyxla does what torch_xla does: it runs the pending graph to read the inputs,
runs the op on the CPU and uploads the result, counting `aten::<op>` (`aten::nonzero`,
`aten::masked_select`, `aten::index`, `aten::_unique2`, ...; see
`lazyxla.debug.metrics.executed_fallback_ops()`). Each call is a value read: the graph is cut
there, and what follows is compiled as another program. Static-shape forms stay on the
device: `torch.where(m, x, 0)` or `(x * m).sum()` instead of `x[m]` / `x[m].sum()`;
writes through a mask (`x[m] = v`, `masked_fill`, `index_put` with a mask, `masked_scatter`)
have a static shape and are lowered.

Others answer with a Python value, so the value has to reach the host; each is a value read
that cuts the graph (as in torch_xla):

- `_local_scalar_dense` is `.item()` (also `narrow` or `tensor_split` given a 0-dim tensor,
  and decompositions that check a value, such as `gaussian_nll_loss`'s check of `var >= 0`);
- `equal(a, b)` and `allclose(a, b)` return a Python bool (`cov` and `corrcoef` call `equal`
  on their weights); `torch.all(a == b)` or `torch.isclose(a, b).all()` stay on the device.

Sparse layouts (`to_sparse`, `torch.sparse.*`) are refused with an error that says so: XLA
keeps dense arrays only, and so does torch_xla.
"""


# Known causes of the remaining failures, shown next to them while they fail.
_KNOWN: dict = {}  # op packet -> what is known about why it fails (none is known to fail today)


def page(classes: dict, verified=None) -> str:
    """The whole docs/coverage.md page: the key, the totals, the reasons, the table."""
    versions = f"PyTorch {torch.__version__}, JAX {jax.__version__}"
    parts = [_PAGE_INTRO.format(versions=versions), "## Totals\n",
             "\n".join("- " + line for line in summary(classes, verified).splitlines()) + "\n"]
    if verified:
        bad = [(op, r) for op, r in sorted(verified.items(), key=lambda kv: op_name(kv[0]))
               if r.status in ("error", "no-sample")
               or (r.status == "fallback" and packet_name(op) not in EXPECTED_FALLBACK)]
        if bad:
            parts.append("Not yet running as intended:\n")
            parts.append("\n".join(f"- `{op_name(op)}` ({r.status}): "
                                   + (f"{_KNOWN[packet_name(op)]} " if packet_name(op) in _KNOWN else "")
                                   + f"({_cell(r.detail, 400)})" for op, r in bad)
                         + "\n")
    parts.append(_PAGE_WHY)
    parts.append("## All core ops\n")
    parts.append(markdown(classes, verified))
    return "\n".join(parts)


def add_arguments(p) -> None:
    """The ``lazyxla coverage`` subcommand's options (``lazyxla.cli``)."""
    p.add_argument("--verify", action="store_true",
                   help="run every op on its OpInfo samples and compare with eager CPU (slow)")
    p.add_argument("--markdown", metavar="FILE", help="also write the page (docs/coverage.md, or with "
                   "--opinfo docs/opinfo.md) to FILE")
    opinfo_check.add_arguments(p)


def run(args) -> int:
    """The ``lazyxla coverage`` subcommand: the table and the totals on stdout."""
    if getattr(args, "opinfo", False):
        return opinfo_check.main(args)
    classes = classification()
    verified = None
    if getattr(args, "verify", False):
        def progress(i, n, op):
            end = "\n" if i + 1 == n else ""
            print(f"\r[{i + 1}/{n}] {op_name(op):<48}", end=end, file=sys.stderr, flush=True)
        print("collecting OpInfo samples ...", file=sys.stderr, flush=True)
        verified = verify(progress=progress)
    print(markdown(classes, verified) + "\n" + summary(classes, verified))
    if getattr(args, "markdown", None):
        with open(args.markdown, "w") as f:
            f.write(page(classes, verified))
    return 0
