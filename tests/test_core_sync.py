"""Sync, value reads and transfers as a user sees them (R4, R5, R1.6, R9.5 in docs/design.md).

Counters are process-global: every assertion is on a delta. Each test that counts compiles
uses tensor lengths no other test uses, so its programs were never compiled before.
"""
from __future__ import annotations

import gc
import itertools
import os
import re
import subprocess
import sys
import threading

import pytest
import torch

import lazyxla
from lazyhelp import cnt, samples
import lazyxla.debug.metrics as met

DEV = lazyxla.device()

pytestmark = pytest.mark.usefixtures("nothing_pending", "exact_shapes")  # fresh sizes per test: the seed's counts
_sizes = itertools.count(2101)


def fresh() -> int:
    return next(_sizes)


class Delta:
    """Counter deltas since construction: ``d["UncachedCompile"]``."""

    def __init__(self):
        self.base = {k: cnt(k) for k in met.counter_names()}

    def __getitem__(self, name):
        return cnt(name) - self.base.get(name, 0)


def host_and_dev(n, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, generator=g, dtype=dtype)
    return h, h.to(DEV)


def test_device_api():
    assert DEV == torch.device("lazyxla", 0)
    assert DEV.type == "lazyxla"
    assert torch.zeros(2, device="lazyxla").device == DEV
    assert torch.ones(2).to("lazyxla:0").device == DEV
    assert (torch.ones(2, device=DEV) + 1).device == DEV


# ---------------------------------------------------------------------------------------
# Transfers: an upload is device data at once (no IR).
def test_upload_creates_device_data_without_ir():
    n = fresh()
    host = torch.randn(n)
    t0 = samples("TransferToDeviceTime")
    d = Delta()
    x = host.to(DEV)
    assert x.device == DEV
    assert x.device.type == "lazyxla"
    assert samples("TransferToDeviceTime") > t0
    lazyxla.sync()
    assert d["UncachedCompile"] == 0
    assert d["CachedCompile"] == 0
    assert d["ExecuteComputation"] == 0
    assert d["MarkStep"] == 1
    # Reading device data compiles nothing either.
    torch.testing.assert_close(x.cpu(), host, rtol=0, atol=0)
    assert d["UncachedCompile"] == 0 and d["CachedCompile"] == 0


def test_upload_is_a_copy_of_the_host_tensor():
    # Changing the CPU tensor after .to(dev) must not change the device tensor.
    host = torch.zeros(fresh())
    x = host.to(DEV)
    host.fill_(7.0)
    host2 = torch.arange(8, dtype=torch.float64)
    y = host2.to(DEV)
    host2.add_(100)
    torch.testing.assert_close(x.cpu(), torch.zeros(host.shape), rtol=0, atol=0)
    torch.testing.assert_close(y.cpu(), torch.arange(8, dtype=torch.float64), rtol=0, atol=0)


def test_read_result_is_a_copy_of_the_device_tensor():
    h, x = host_and_dev(fresh(), seed=13)
    got = x.cpu()
    got.fill_(-1.0)
    torch.testing.assert_close(x.cpu(), h, rtol=0, atol=0)


def test_model_to_device_uploads_without_compiling():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    ref = {k: v.detach().clone() for k, v in model.state_dict().items()}
    t0 = samples("TransferToDeviceTime")
    d = Delta()
    model.to(DEV)
    assert all(p.device == DEV for p in model.parameters())
    assert samples("TransferToDeviceTime") - t0 >= 4  # two weights, two biases
    lazyxla.sync()
    assert d["UncachedCompile"] == 0 and d["CachedCompile"] == 0 and d["ExecuteComputation"] == 0
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v.cpu(), ref[k], rtol=0, atol=0)


def test_cpu_read_counts_transfer_from_device():
    _, x = host_and_dev(fresh(), seed=1)
    t0 = samples("TransferFromDeviceTime")
    x.cpu()
    assert samples("TransferFromDeviceTime") > t0


# ---------------------------------------------------------------------------------------
# R4: sync.
def test_sync_replaces_pending_ir_with_device_data():
    h, x = host_and_dev(fresh(), seed=2)
    y = x * 3 + 2
    hash_pending = lazyxla.graph_hash([y])
    d = Delta()
    lazyxla.sync()
    assert d["UncachedCompile"] == 1
    assert d["ExecuteComputation"] == 1
    assert d["MarkStep"] == 1
    # No pending IR is left: the tensor's graph is not what it was.
    assert lazyxla.graph_hash([y]) != hash_pending
    d2 = Delta()
    lazyxla.sync()  # nothing new: nothing compiled, looked up or executed
    assert d2["UncachedCompile"] == 0
    assert d2["CachedCompile"] == 0
    assert d2["ExecuteComputation"] == 0
    assert d2["MarkStep"] == 1
    torch.testing.assert_close(y.cpu(), h * 3 + 2)
    assert d2["UncachedCompile"] == 0 and d2["CachedCompile"] == 0
    assert d2["ExecuteComputation"] == 0


def test_sync_with_nothing_pending_compiles_nothing():
    d = Delta()
    lazyxla.sync()
    lazyxla.sync()
    assert d["UncachedCompile"] == 0
    assert d["CachedCompile"] == 0
    assert d["ExecuteComputation"] == 0
    assert d["MarkStep"] == 2


def test_sync_runs_every_live_pending_tensor_in_one_program():
    n = fresh()
    h, x = host_and_dev(n, seed=3)
    a = x + 2
    b = x * 2
    c = (a * b).sum()
    d = Delta()
    lazyxla.sync()
    assert d["UncachedCompile"] == 1
    assert d["ExecuteComputation"] == 1
    d2 = Delta()
    torch.testing.assert_close(a.cpu(), h + 2)
    torch.testing.assert_close(b.cpu(), h * 2)
    torch.testing.assert_close(c.cpu(), ((h + 2) * (h * 2)).sum(), rtol=1e-5, atol=1e-4)
    assert d2["UncachedCompile"] == 0 and d2["CachedCompile"] == 0 and d2["ExecuteComputation"] == 0


def test_dropped_tensors_are_not_synced():
    n = fresh()
    h, x = host_and_dev(n, seed=4)
    keep = x + 5
    dropped = x.exp()  # noqa: F841
    del dropped
    gc.collect()
    hash_keep = lazyxla.graph_hash([keep])
    d = Delta()
    lazyxla.sync()
    assert d["UncachedCompile"] + d["CachedCompile"] == 1
    torch.testing.assert_close(keep.cpu(), h + 5)
    # Same program again, keep only: it is the very same key (the dropped tensor never counted).
    keep2 = x + 5  # noqa: F841
    assert lazyxla.graph_hash([keep2]) == hash_keep
    d2 = Delta()
    lazyxla.sync()
    assert d2["CachedCompile"] == 1 and d2["UncachedCompile"] == 0


def test_sync_no_wait_then_wait_device_ops():
    n = fresh()
    g = torch.Generator().manual_seed(5)
    ha, hb = torch.randn(n, 16, generator=g), torch.randn(16, 16, generator=g)
    a, b = ha.to(DEV), hb.to(DEV)
    y = torch.tanh(a @ b) @ b + 1.5
    e0 = samples("ExecuteTime")
    ret = lazyxla.sync(wait=False)
    assert ret is None
    lazyxla.wait_device_ops()
    # ExecuteTime is recorded when the program has finished: by now it has.
    assert samples("ExecuteTime") - e0 >= 1
    d = Delta()
    torch.testing.assert_close(y.cpu(), torch.tanh(ha @ hb) @ hb + 1.5, rtol=1e-5, atol=1e-5)
    assert d["UncachedCompile"] == 0 and d["CachedCompile"] == 0


def test_sync_wait_true():
    h, x = host_and_dev(fresh(), seed=6)
    y = x.abs().sqrt()
    e0 = samples("ExecuteTime")
    lazyxla.sync(wait=True)
    assert samples("ExecuteTime") - e0 >= 1
    torch.testing.assert_close(y.cpu(), h.abs().sqrt())


def test_wait_device_ops_with_nothing_scheduled():
    lazyxla.wait_device_ops()
    lazyxla.wait_device_ops()


def test_in_place_updates_then_sync():
    h, x = host_and_dev(fresh(), seed=7)
    x.mul_(2).add_(1)
    x -= 0.5
    lazyxla.sync()
    torch.testing.assert_close(x.cpu(), h * 2 + 1 - 0.5)
    x += 1
    lazyxla.sync()
    torch.testing.assert_close(x.cpu(), h * 2 + 1 - 0.5 + 1)


# ---------------------------------------------------------------------------------------
# R5: value reads keep the IR.
def _number_in(text):
    m = re.search(r"tensor\(\s*([-+0-9.eE]+)", text)
    assert m, text
    return float(m.group(1))


READS = {
    "item": lambda t: t.item(),
    "cpu": lambda t: t.cpu(),
    "repr": lambda t: repr(t),
    "tolist": lambda t: t.tolist(),
    "numpy": lambda t: t.numpy(),
    "bool": lambda t: bool(t),
}


@pytest.mark.parametrize("kind", sorted(READS))
def test_value_read_keeps_ir_then_sync_compiles_again(kind):
    n = fresh()
    h, x = host_and_dev(n, seed=8)
    y = (x * 3 + 1).abs().sum()  # 0-dim, non-zero: every read kind applies
    expected = (h * 3 + 1).abs().sum()
    before = lazyxla.graph_hash([y])
    d = Delta()
    value = READS[kind](y)
    assert d["UncachedCompile"] == 1
    if kind in ("item",):
        assert value == pytest.approx(expected.item(), rel=1e-5)
    elif kind == "bool":
        assert value is True
    elif kind == "repr":
        assert "lazyxla" in value
        assert _number_in(value) == pytest.approx(expected.item(), rel=1e-4)
    else:
        torch.testing.assert_close(torch.as_tensor(value), expected, rtol=1e-5, atol=1e-4)
    # The IR is still pending: same graph hash as before the read.
    assert lazyxla.graph_hash([y]) == before
    lazyxla.sync()
    # The seed's documented behaviour: a read then a sync of the same graph compiles twice.
    assert d["UncachedCompile"] == 2
    assert lazyxla.graph_hash([y]) != before
    torch.testing.assert_close(y.cpu(), expected, rtol=1e-5, atol=1e-4)
    assert d["UncachedCompile"] == 2


def test_print_keeps_ir(capsys):
    n = fresh()
    h, x = host_and_dev(n, seed=9)
    y = (x - 4).abs().max()
    before = lazyxla.graph_hash([y])
    d = Delta()
    print(y)
    out = capsys.readouterr().out
    assert "lazyxla" in out
    assert _number_in(out) == pytest.approx((h - 4).abs().max().item(), rel=1e-4)
    assert lazyxla.graph_hash([y]) == before
    lazyxla.sync()
    assert d["UncachedCompile"] == 2


def test_format_spec_of_a_scalar_reads_its_value():
    # f"loss {loss:.4f}", the most common log line, formats the number as torch.Tensor does
    n = fresh()
    h, x = host_and_dev(n, seed=10)
    loss = (x * 3).mean()
    d = Delta()
    assert f"{loss:.4f}" == f"{(h * 3).mean().item():.4f}"
    assert float(f"{loss}") == pytest.approx((h * 3).mean().item(), rel=1e-5)
    assert d["UncachedCompile"] == 1 and d["CachedCompile"] == 1  # two value reads, one program
    with pytest.raises(TypeError, match="unsupported format string"):
        f"{x:.4f}"  # as for a CPU tensor of more than one element


def test_reading_twice_gives_same_numbers_and_second_is_cached():
    n = fresh()
    h, x = host_and_dev(n, seed=10)
    y = torch.sin(x) * 2 - x
    d = Delta()
    v1 = y.cpu()
    assert d["UncachedCompile"] == 1 and d["CachedCompile"] == 0
    v2 = y.cpu()
    assert d["UncachedCompile"] == 1 and d["CachedCompile"] == 1
    torch.testing.assert_close(v1, v2, rtol=0, atol=0)
    torch.testing.assert_close(v1, torch.sin(h) * 2 - h)


def test_reading_twice_does_not_apply_an_update_twice():
    # SEED's donation counterexample (R9.5): A += 0.4 read twice shows 1.4 both times; a sync
    # then advances A exactly once; B = A + 0.9 recorded before the update is unaffected.
    a = torch.full((3,), 1.0).to(DEV)
    b = a + 0.9
    a += 0.4
    first = a.cpu()
    second = a.cpu()
    torch.testing.assert_close(first, torch.full((3,), 1.4))
    torch.testing.assert_close(second, torch.full((3,), 1.4))
    lazyxla.sync()
    torch.testing.assert_close(a.cpu(), torch.full((3,), 1.4))
    torch.testing.assert_close(b.cpu(), torch.full((3,), 1.9))
    torch.testing.assert_close(a.cpu(), torch.full((3,), 1.4))


def test_read_after_sync_compiles_nothing():
    h, x = host_and_dev(fresh(), seed=11)
    y = x.exp()
    z = y.sum()
    lazyxla.sync()
    d = Delta()
    torch.testing.assert_close(y.cpu(), h.exp())
    assert z.item() == pytest.approx(h.exp().sum().item(), rel=1e-5)
    y.tolist()
    y.numpy()
    repr(y)
    bool(z)
    assert d["UncachedCompile"] == 0
    assert d["CachedCompile"] == 0
    assert d["ExecuteComputation"] == 0


def test_value_read_does_not_touch_other_pending_tensors():
    n = fresh()
    h, x = host_and_dev(n, seed=12)
    y = x + 10
    z = x * 10
    hz = lazyxla.graph_hash([z])
    y.cpu()
    assert lazyxla.graph_hash([z]) == hz  # z still has its pending IR
    torch.testing.assert_close(z.cpu(), h * 10)


def test_view_sees_later_update_before_and_after_sync():
    # R1.6: a view read at two different times reflects changes to its source in between.
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3).to(DEV)
    h = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    v = a[0]
    v += 1
    h[0] += 1
    torch.testing.assert_close(a.cpu(), h)
    a.mul_(2)
    h.mul_(2)
    torch.testing.assert_close(v.cpu(), h[0])
    lazyxla.sync()
    torch.testing.assert_close(a.cpu(), h)
    torch.testing.assert_close(v.cpu(), h[0])
    a[1] = 7.0
    h[1] = 7.0
    lazyxla.sync()
    torch.testing.assert_close(a.cpu(), h)


class _WhereIsBackward(torch.autograd.Function):
    """Identity whose backward notes the thread it runs on."""
    threads: list = []

    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        _WhereIsBackward.threads.append(threading.get_ident())
        return g


def test_backward_runs_in_the_calling_thread():
    # PyTorch runs a non-CPU device's backward on a thread of its own; lazyxla turns that
    # hand-off off for the thread that asks for its device (backward only records IR).
    x = torch.ones(3, device=DEV, requires_grad=True)
    _WhereIsBackward.threads.clear()
    _WhereIsBackward.apply(x).sum().backward()
    assert _WhereIsBackward.threads == [threading.get_ident()]
    assert x.grad.tolist() == [1.0, 1.0, 1.0]


def test_autograd_device_thread_can_be_kept():
    code = (
        "import threading, torch, lazyxla\n"
        "dev = lazyxla.device()\n"
        "seen = []\n"
        "class F(torch.autograd.Function):\n"
        "    @staticmethod\n"
        "    def forward(ctx, x): return x * 1.0\n"
        "    @staticmethod\n"
        "    def backward(ctx, g):\n"
        "        seen.append(threading.get_ident()); return g\n"
        "x = torch.ones(3, device=dev, requires_grad=True)\n"
        "F.apply(x).sum().backward()\n"
        "print(seen[0] == threading.get_ident(), x.grad.tolist())\n"
    )
    env = dict(os.environ, LAZYXLA_AUTOGRAD_DEVICE_THREAD="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[0] == "False [1.0, 1.0, 1.0]"
