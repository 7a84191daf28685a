"""Numbers and dtypes on the lazy device against PyTorch eager CPU.

Each test records many ops lazily, syncs once (one program) and compares every result with
the same op run eagerly on the CPU.
"""
from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyhelp import needs_wide_int64

DEV = lazyxla.device()

pytestmark = pytest.mark.usefixtures("nothing_pending")
RTOL, ATOL = 1e-5, 1e-6


def inputs(*shapes, seed=0, positive=False, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    hs = [torch.randn(tuple(s), generator=g, dtype=dtype) for s in shapes]
    if positive:
        hs = [h.abs() + 0.1 for h in hs]
    return hs, [h.to(DEV) for h in hs]


def check_all(cases, hosts, devs, rtol=RTOL, atol=ATOL):
    """cases: {name: fn(*tensors)}; runs each on device (lazily, one sync) and on the CPU."""
    lazy = {name: fn(*devs) for name, fn in cases.items()}
    lazyxla.sync()
    failures = []
    for name, fn in cases.items():
        want = fn(*hosts)
        got = lazy[name]
        wants = want if isinstance(want, (tuple, list)) else (want,)
        gots = got if isinstance(got, (tuple, list)) else (got,)
        for w, g in zip(wants, gots):
            try:
                assert g.device == DEV, f"{name}: result on {g.device}"
                gc_ = g.cpu()
                assert gc_.dtype == w.dtype, f"{name}: dtype {gc_.dtype} != {w.dtype}"
                assert gc_.shape == w.shape, f"{name}: shape {tuple(gc_.shape)} != {tuple(w.shape)}"
                torch.testing.assert_close(gc_, w, rtol=rtol, atol=atol, equal_nan=True)
            except AssertionError as e:
                failures.append(f"{name}: {str(e).splitlines()[0]}")
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------------------------
def test_elementwise():
    cases = {
        "add": lambda x, y: x + y,
        "sub": lambda x, y: x - y,
        "mul": lambda x, y: x * y,
        "div": lambda x, y: x / y,
        "neg": lambda x, y: -x,
        "abs": lambda x, y: x.abs(),
        "exp": lambda x, y: x.exp(),
        "log": lambda x, y: x.abs().add(0.5).log(),
        "sqrt": lambda x, y: x.abs().sqrt(),
        "rsqrt": lambda x, y: (x.abs() + 0.5).rsqrt(),
        "sin": lambda x, y: x.sin(),
        "cos": lambda x, y: x.cos(),
        "tanh": lambda x, y: x.tanh(),
        "sigmoid": lambda x, y: x.sigmoid(),
        "relu": lambda x, y: x.relu(),
        "gelu": lambda x, y: F.gelu(x),
        "pow2": lambda x, y: x.pow(2),
        "pow_half": lambda x, y: x.abs().pow(0.5),
        "pow_tensor": lambda x, y: x.abs().add(0.5).pow(y),
        "maximum": lambda x, y: torch.maximum(x, y),
        "minimum": lambda x, y: torch.minimum(x, y),
        "atan2": lambda x, y: torch.atan2(x, y),
        "hypot": lambda x, y: torch.hypot(x, y),
        "where": lambda x, y: torch.where(x > y, x, y * 2),
        "clamp": lambda x, y: x.clamp(-0.5, 0.7),
        "scalar_mix": lambda x, y: 2.5 * x - y / 3.0 + 1,
        "rsub": lambda x, y: 2.0 - x,
        "floor": lambda x, y: (x * 3).floor(),
        "round": lambda x, y: (x * 3).round(),
        "sign": lambda x, y: x.sign(),
        "remainder": lambda x, y: torch.remainder(x * 5, 1.5),
        "lerp": lambda x, y: torch.lerp(x, y, 0.3),
        "addcmul": lambda x, y: torch.addcmul(x, x, y, value=0.5),
        "gt": lambda x, y: x > y,
        "eq": lambda x, y: (x * 0) == 0,
        "logical": lambda x, y: (x > 0) & (y < 0) | (x > 1),
        "is_all_true": lambda x, y: torch._is_all_true(x > -3),
        "is_any_true": lambda x, y: torch._is_any_true(x > y),
        "to_double": lambda x, y: x.double() * 3,
        "to_int": lambda x, y: (x * 10).to(torch.int64),
    }
    hosts, devs = inputs((5, 7), (5, 7), seed=1)
    check_all(cases, hosts, devs)


def test_broadcasting():
    cases = {
        "row": lambda a, b, c, s: a + b,
        "col": lambda a, b, c, s: a * c,
        "outer": lambda a, b, c, s: c - b,
        "scalar_tensor": lambda a, b, c, s: a * s + s,
        "3d": lambda a, b, c, s: a.unsqueeze(0) + a.unsqueeze(1)[:, :, :1],
        "expand": lambda a, b, c, s: b.expand(4, 5) * 2,
    }
    hosts, devs = inputs((4, 5), (5,), (4, 1), (), seed=2)
    check_all(cases, hosts, devs)


def test_reductions():
    cases = {
        "sum": lambda x: x.sum(),
        "sum0": lambda x: x.sum(0),
        "sum1_keep": lambda x: x.sum(1, keepdim=True),
        "sum_dims": lambda x: x.sum((0, 2)),
        "mean": lambda x: x.mean(),
        "mean2": lambda x: x.mean(2),
        "max": lambda x: x.max(),
        "max_dim": lambda x: x.max(1),
        "min_dim": lambda x: x.min(2),
        "amax": lambda x: x.amax((1, 2)),
        "argmax": lambda x: x.argmax(1),
        "argmin": lambda x: x.argmin(),
        "prod": lambda x: (x * 0.5 + 1).prod(2),
        "var": lambda x: x.var(1),
        "std": lambda x: x.std(),
        "logsumexp": lambda x: torch.logsumexp(x, 1),
        "softmax": lambda x: torch.softmax(x, -1),
        "log_softmax": lambda x: torch.log_softmax(x, 0),
        "cumsum": lambda x: x.cumsum(1),
        "norm": lambda x: x.norm(),
        "any": lambda x: (x > 2).any(),
        "all": lambda x: (x > -5).all(1),
    }
    hosts, devs = inputs((3, 4, 5), seed=3)
    check_all(cases, hosts, devs, rtol=1e-5, atol=1e-5)


def test_matmul():
    cases = {
        "mm": lambda a, b, v, b3: a @ b,
        "mv": lambda a, b, v, b3: b.t() @ v,
        "bmm": lambda a, b, v, b3: torch.bmm(b3, b3.transpose(1, 2)),
        "matmul_bcast": lambda a, b, v, b3: torch.matmul(b3, b.t()),
        "linear": lambda a, b, v, b3: F.linear(a, b.t(), b[0]),
        "einsum": lambda a, b, v, b3: torch.einsum("ij,jk->ik", a, b),
        "dot": lambda a, b, v, b3: torch.dot(v, v),
        "chain": lambda a, b, v, b3: torch.tanh(a @ b) @ b.t(),
    }
    hosts, devs = inputs((3, 5), (5, 6), (5,), (2, 4, 6), seed=4)
    check_all(cases, hosts, devs, rtol=1e-5, atol=1e-5)


def test_shape_ops():
    cases = {
        "reshape": lambda x: x.reshape(6, 4) * 2,
        "permute": lambda x: x.permute(2, 0, 1) + 1,
        "transpose": lambda x: x.transpose(0, 2).contiguous(),
        "slice": lambda x: x[:, 1:3, ::2] * 3,
        "index": lambda x: x[1] - x[0],
        "cat": lambda x: torch.cat([x, x * 2], 1),
        "stack": lambda x: torch.stack([x[0], x[1]], -1),
        "flip": lambda x: x.flip(1),
        "gather": lambda x: torch.gather(x, 2, torch.zeros(2, 3, 2, dtype=torch.long, device=x.device)),
        "index_select": lambda x: x.index_select(1, torch.tensor([2, 0], device=x.device)),
        "squeeze": lambda x: x[:, :1].squeeze(1),
        "tril": lambda x: x[0].tril(),
    }
    hosts, devs = inputs((2, 3, 4), seed=5)
    check_all(cases, hosts, devs)


def test_autograd_matches_eager():
    hosts, devs = inputs((4, 3), (3, 2), seed=6)
    hw = [h.clone().requires_grad_(True) for h in hosts]
    dw = [d.clone().requires_grad_(True) for d in devs]
    for ws in (hw, dw):
        out = torch.tanh(ws[0] @ ws[1]).pow(2).sum()
        out.backward()
    lazyxla.sync()
    for h, d in zip(hw, dw):
        torch.testing.assert_close(d.grad.cpu(), h.grad, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------
# Factories with device=dev.
def test_factories():
    lazy = {
        "zeros": torch.zeros(2, 3, device=DEV),
        "ones": torch.ones(4, device=DEV, dtype=torch.float64),
        "full": torch.full((2, 2), 3.5, device=DEV),
        "full_int": torch.full((3,), 7, device=DEV, dtype=torch.int64),
        "arange": torch.arange(5, device=DEV),
        "arange_step": torch.arange(1.0, 4.0, 0.5, device=DEV),
        "tensor": torch.tensor([[1.5, -2.0], [3.25, 4.0]], device=DEV),
        "tensor_int": torch.tensor([1, 2, 3], device=DEV),
        "zeros_like": torch.zeros_like(torch.ones(3, device=DEV)),
    }
    eager = {
        "zeros": torch.zeros(2, 3),
        "ones": torch.ones(4, dtype=torch.float64),
        "full": torch.full((2, 2), 3.5),
        "full_int": torch.full((3,), 7, dtype=torch.int64),
        "arange": torch.arange(5),
        "arange_step": torch.arange(1.0, 4.0, 0.5),
        "tensor": torch.tensor([[1.5, -2.0], [3.25, 4.0]]),
        "tensor_int": torch.tensor([1, 2, 3]),
        "zeros_like": torch.zeros(3),
    }
    for name, t in lazy.items():
        assert t.device == DEV, name
        assert t.dtype == eager[name].dtype, name
    lazyxla.sync()
    for name, t in lazy.items():
        torch.testing.assert_close(t.cpu(), eager[name], rtol=0, atol=0, msg=name)


def test_random_factories_shape_and_dtype():
    r = torch.randn(3, 4, device=DEV)
    u = torch.rand(5, device=DEV, dtype=torch.float64)
    i = torch.randint(0, 10, (6,), device=DEV)
    assert (r.shape, r.dtype, r.device) == (torch.Size([3, 4]), torch.float32, DEV)
    assert (u.shape, u.dtype) == (torch.Size([5]), torch.float64)
    assert (i.shape, i.dtype) == (torch.Size([6]), torch.int64)
    lazyxla.sync()
    assert r.cpu().dtype == torch.float32
    assert u.cpu().dtype == torch.float64
    iv = i.cpu()
    assert iv.dtype == torch.int64 and 0 <= iv.min() and iv.max() < 10


# ---------------------------------------------------------------------------------------
# 64-bit types stay 64-bit.
def test_int64_default_dtype():
    assert torch.arange(3, device=DEV).dtype == torch.int64
    assert torch.tensor([1, 2], device=DEV).dtype == torch.int64
    x = torch.arange(3, device=DEV)
    assert (x * 2).dtype == torch.int64
    assert x.sum().dtype == torch.int64
    assert x.cpu().dtype == torch.int64


def test_int64_large_values_survive_arithmetic():
    needs_wide_int64()
    big = 2 ** 40 + 12345
    h = torch.tensor([big, -big, 2 ** 53 + 1, 2 ** 62 - 1], dtype=torch.int64)
    x = h.to(DEV)
    y = x * 3 + 7
    z = (x - 1) // 2
    s = x[:2].sum() + x[2]
    w = x.max()
    lazyxla.sync()
    assert y.cpu().tolist() == [big * 3 + 7, -big * 3 + 7, (2 ** 53 + 1) * 3 + 7, ((2 ** 62 - 1) * 3 + 7 + 2 ** 63) % 2 ** 64 - 2 ** 63]
    assert torch.equal(y.cpu(), h * 3 + 7)
    assert torch.equal(z.cpu(), (h - 1) // 2)
    assert s.item() == 2 ** 53 + 1
    assert w.item() == 2 ** 62 - 1
    assert torch.arange(2 ** 40, 2 ** 40 + 3, device=DEV).cpu().tolist() == [2 ** 40, 2 ** 40 + 1, 2 ** 40 + 2]


@pytest.mark.cpu_only("a TPU keeps float64 as two float32s (about 48 bits of mantissa, not 53)")
def test_float64_round_trips_exactly_and_computes_in_64_bit():
    g = torch.Generator().manual_seed(7)
    h = torch.randn(50, generator=g, dtype=torch.float64) * 1e3
    h[0] = 1 / 3
    h[1] = 1e-300
    h[2] = 2.0 ** 60 + 2.0 ** 8  # exact in float64, not in float32
    x = h.to(DEV)
    assert x.dtype == torch.float64
    back = x.cpu()
    assert back.dtype == torch.float64
    assert torch.equal(back, h)
    y = x * 1.0000001 + 1e-9  # float32 arithmetic would lose these digits
    lazyxla.sync()
    want = h * 1.0000001 + 1e-9
    assert y.cpu().dtype == torch.float64
    torch.testing.assert_close(y.cpu(), want, rtol=1e-15, atol=0)
    t = torch.tensor([0.1, 1 / 3], dtype=torch.float64, device=DEV)
    assert t.cpu().tolist() == [0.1, 1 / 3]


def test_small_dtypes_round_trip():
    for dt in (torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.float16, torch.bfloat16):
        h = torch.tensor([0, 1, 2, 3], dtype=dt) if dt != torch.bool else torch.tensor([True, False, True])
        x = h.to(DEV)
        assert x.dtype == dt
        assert torch.equal(x.cpu(), h), dt


def test_linspace_and_logspace():
    for kw in (dict(), dict(base=2.0), dict(dtype=torch.float64)):
        torch.testing.assert_close(torch.logspace(-1, 2, 7, device=DEV, **kw).cpu(), torch.logspace(-1, 2, 7, **kw),
                                   rtol=1e-6, atol=0)
    torch.testing.assert_close(torch.linspace(-1, 1, 7, device=DEV).cpu(), torch.linspace(-1, 1, 7), rtol=1e-6,
                               atol=1e-7)
    out = torch.empty(4, device=DEV)  # the out= form runs on the CPU and writes out back
    torch.logspace(0, 1, 4, out=out)
    torch.testing.assert_close(out.cpu(), torch.logspace(0, 1, 4))
