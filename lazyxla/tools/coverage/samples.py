"""OpInfo samples recorded at the ATen level: every sample of an OpInfo runs on the CPU under a
dispatch mode below autograd that keeps the arguments of each core op it reaches (a composite
op is kept, then followed into its decomposition), so each core op is replayed exactly as
PyTorch calls it; backward ops come from a backward pass. Hand-made samples fill in ops no
OpInfo reaches.

Touches nothing (the CPU RNG is restored).
"""
from __future__ import annotations

import collections
import dataclasses
import time
import warnings

import torch
from torch._ops import OpOverload
from torch.utils._pytree import tree_flatten, tree_map

from .ops import aten, packet_name


# ---------------------------------------------------------------------------------------
# Samples: OpInfo inputs recorded at the ATen level.
@dataclasses.dataclass
class Sample:
    op: OpOverload
    args: tuple
    kwargs: dict
    source: str  # the OpInfo (or "handmade")


def detach_clone(x):
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
                store.append(Sample(func, tree_map(detach_clone, tuple(args)),
                                    tree_map(detach_clone, dict(kwargs)), self.source))
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
