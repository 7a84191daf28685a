"""The compilation cache as a user sees it (R6, R14 metric names in docs/design.md).

Every cache lookup counts exactly one of UncachedCompile / CachedCompile; a warm training
loop stops compiling; XLA_COMPILATION_CACHE_SIZE bounds an LRU (checked in subprocesses,
because the size is read once per process).
"""
from __future__ import annotations

import copy
import gc
import itertools
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyhelp import cnt, samples
import lazyxla.debug.metrics as met

DEV = lazyxla.device()

pytestmark = pytest.mark.usefixtures("nothing_pending", "exact_shapes")  # fresh sizes per test: the seed's counts
_sizes = itertools.count(3101)


def fresh() -> int:
    return next(_sizes)


def lookups():
    return cnt("UncachedCompile") + cnt("CachedCompile")


# ---------------------------------------------------------------------------------------
def test_each_lookup_counts_exactly_one_of_uncached_or_cached():
    n = fresh()
    h = torch.randn(n)
    x = h.to(DEV)
    steps = [
        lambda: (x * 2).cpu(),            # read: miss
        lambda: (x * 2).cpu(),            # same read: hit
        lambda: lazyxla.sync(),           # nothing pending: no lookup
    ]
    expect_lookups = [1, 1, 0]
    for step, n_lookups in zip(steps, expect_lookups):
        before = lookups()
        step()
        assert lookups() - before == n_lookups
    # syncs of pending work: one lookup each, whether hit or miss
    for i in range(3):
        y = x + 3  # noqa: F841
        u, c = cnt("UncachedCompile"), cnt("CachedCompile")
        lazyxla.sync()
        du, dc = cnt("UncachedCompile") - u, cnt("CachedCompile") - c
        assert du + dc == 1
        assert (du, dc) == ((1, 0) if i == 0 else (0, 1))


def test_compile_and_execute_metrics_get_samples():
    n = fresh()
    x = torch.randn(n).to(DEV)
    traced = samples("LazyTracing")
    y = torch.relu(x) * 4 - 1  # noqa: F841
    assert samples("LazyTracing") - traced == 3  # one per recorded op
    before = {m: samples(m) for m in ("CompileTime", "ExecuteTime", "TensorsGraphSize")}
    u = cnt("UncachedCompile")
    lazyxla.sync()
    lazyxla.wait_device_ops()
    assert cnt("UncachedCompile") - u == 1
    assert samples("CompileTime") - before["CompileTime"] == 1  # one per compile
    assert samples("ExecuteTime") - before["ExecuteTime"] >= 1
    assert samples("TensorsGraphSize") - before["TensorsGraphSize"] >= 1
    # A cache hit does not compile: CompileTime does not move.
    del y
    y = torch.relu(x) * 4 - 1  # noqa: F841
    ct = samples("CompileTime")
    lazyxla.sync()
    assert samples("CompileTime") == ct
    # Accumulated times are positive durations.
    count, acc, pts = met.metric_data("CompileTime")
    assert acc > 0 and len(pts) >= 1


def test_tensors_graph_size_reflects_the_graph():
    n = fresh()
    x = torch.randn(n).to(DEV)
    small = x + 2  # noqa: F841
    lazyxla.sync()
    lazyxla.wait_device_ops()
    _, _, pts = met.metric_data("TensorsGraphSize")
    small_size = pts[-1][1]
    del small
    big = x  # noqa: F841
    for _ in range(10):
        big = big.sin() + 2
    lazyxla.sync()
    _, _, pts = met.metric_data("TensorsGraphSize")
    assert pts[-1][1] > small_size


def test_transfer_metrics_get_samples():
    n = fresh()
    t0, f0 = samples("TransferToDeviceTime"), samples("TransferFromDeviceTime")
    x = torch.randn(n).to(DEV)
    assert samples("TransferToDeviceTime") - t0 >= 1
    x.cpu()
    assert samples("TransferFromDeviceTime") - f0 >= 1


# ---------------------------------------------------------------------------------------
# R6.2: a warm loop stops compiling.
def test_warm_training_loop_stops_compiling_and_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    ref = copy.deepcopy(model)
    model.to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    X, Y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
    Xd, Yd = X.to(DEV), Y.to(DEV)
    lazyxla.sync()
    uncached = []
    losses, rlosses = [], []
    for step in range(8):
        u = cnt("UncachedCompile")
        opt.zero_grad()
        loss = F.mse_loss(model(Xd), Yd)
        loss.backward()
        opt.step()
        lazyxla.sync()
        uncached.append(cnt("UncachedCompile") - u)
        losses.append(loss)
        ropt.zero_grad()
        rloss = F.mse_loss(ref(X), Y)
        rloss.backward()
        ropt.step()
        rlosses.append(rloss.item())
    assert sum(uncached[3:]) == 0, uncached
    assert uncached[0] >= 1
    # The lazily trained model is the eagerly trained one.
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5)
    got = [float(l.item()) for l in losses]
    assert got == pytest.approx(rlosses, rel=1e-4, abs=1e-6)
    assert got[-1] < got[0]


# ---------------------------------------------------------------------------------------
# R6.1: XLA_COMPILATION_CACHE_SIZE.
_CACHE_SCRIPT = textwrap.dedent("""
    import json, torch, lazyxla
    import lazyxla.debug.metrics as met
    dev = lazyxla.device()

    def cnt(name):
        return met.counter_value(name) or 0

    def run(n):
        # One distinct program per length n; returns "miss" or "hit".
        x = torch.ones(n, device=dev)
        y = x * 2 + 1
        u, c = cnt("UncachedCompile"), cnt("CachedCompile")
        lazyxla.sync()
        assert y.cpu().tolist() == [3.0] * n
        du, dc = cnt("UncachedCompile") - u, cnt("CachedCompile") - c
        assert du + dc == 1, (du, dc)
        return "miss" if du else "hit"

    out = {}
    out["abca"] = [run(n) for n in (3, 4, 5, 3)]
    # LRU, not FIFO: touching D keeps it; E is the least recently used when F arrives.
    out["lru"] = [run(n) for n in (6, 7, 6, 8, 6, 7)]
    print(json.dumps(out))
""")


def _run_cache_script(size):
    env = dict(os.environ)
    env.pop("XLA_COMPILATION_CACHE_SIZE", None)
    env.pop("XLA_PERSISTENT_CACHE_PATH", None)
    if size is not None:
        env["XLA_COMPILATION_CACHE_SIZE"] = str(size)
    return subprocess.Popen([sys.executable, "-c", _CACHE_SCRIPT], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(proc):
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_compilation_cache_size_is_honored():
    small, default = _run_cache_script(2), _run_cache_script(None)
    small, default = _result(small), _result(default)
    # Capacity 2: A, B, C evicts A, so A recompiles.
    assert small["abca"] == ["miss", "miss", "miss", "miss"]
    assert small["lru"] == ["miss", "miss", "hit", "miss", "hit", "miss"]
    # Default capacity (2048): A is still cached.
    assert default["abca"] == ["miss", "miss", "miss", "hit"]
    assert default["lru"] == ["miss", "miss", "hit", "miss", "hit", "hit"]
