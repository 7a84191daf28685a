"""Each core op run on the lazy device on its samples and compared with eager CPU: ``ok``,
``fallback`` (an ``aten::*`` counter moved), ``error`` (raised, or a wrong value) or
``no-sample``. A float difference beyond the tolerances is accepted where the lazy value is no
farther than eager's from a float64 run (ill-conditioned samples).

Touches the lazy device's counters and compilation cache.
"""
from __future__ import annotations

import dataclasses
import gc

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ... import metrics
from ...frontend.device import device
from ...engine.executor import read_values
from ...frontend.tensor import LazyTensor
from .ops import DATA_DEPENDENT, EXPECTED_FALLBACK, core_ops, packet_name
from .samples import detach_clone, collect_samples


STATUSES = ("ok", "fallback", "error", "no-sample")

# Outputs whose values are unspecified or random: only shape and dtype are compared.
_NO_VALUES = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"}
# Only the first outputs are compared: the rest are backward workspaces whose contents
# differ between PyTorch's own CPU and CUDA kernels.
_COMPARED_OUTPUTS = {"_embedding_bag": 1}


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
        return x.detach().double() if isinstance(x, torch.Tensor) and x.dtype in low else detach_clone(x)
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
            ref = op(*tree_map(detach_clone, s.args), **tree_map(detach_clone, s.kwargs))
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
