"""The HLO dump (R10) and the public metrics API (R14 in docs/design.md) through real device work."""
from __future__ import annotations

import gc
import itertools
import re

import pytest
import torch

import lazyxla
from lazyhelp import cnt
import lazyxla.debug.metrics as met

DEV = lazyxla.device()

pytestmark = pytest.mark.usefixtures("nothing_pending", "exact_shapes")  # fresh sizes per test: the seed's counts
_sizes = itertools.count(5101)


def fresh() -> int:
    return next(_sizes)


def snapshot():
    counters = {k: met.counter_value(k) for k in met.counter_names()}
    metrics = {k: met.metric_data(k)[0] for k in met.metric_names()}
    return counters, metrics


# ---------------------------------------------------------------------------------------
# R10: dump_hlo.
def test_dump_hlo_contains_the_ops():
    n = fresh()
    x = torch.randn(n).to(DEV)
    y = torch.randn(n).to(DEV)
    z = x * 3 + y
    text = lazyxla.dump_hlo([z])
    assert isinstance(text, str)
    assert "multiply" in text
    assert "add" in text
    assert str(n) in text  # the shape


def test_dump_hlo_several_tensors():
    n = fresh()
    x = torch.randn(n).to(DEV)
    a = x.exp()
    b = x.sum()
    text = lazyxla.dump_hlo([a, b])
    assert "exponential" in text
    assert "reduce" in text


def test_dump_hlo_leaves_every_counter_and_metric_unchanged():
    n = fresh()
    x = torch.randn(n).to(DEV)
    z = torch.tanh(x * 2.5) - 1
    h = lazyxla.graph_hash([z])
    lazyxla.wait_device_ops()
    gc.collect()
    gc.disable()
    try:
        before = snapshot()
        text = lazyxla.dump_hlo([z])
        text2 = lazyxla.dump_hlo(z)  # a single tensor is accepted too
        after = snapshot()
    finally:
        gc.enable()
    assert "tanh" in text and "tanh" in text2
    assert after == before
    # No cache lookup happened: the tensor is still pending and its sync compiles it now.
    assert lazyxla.graph_hash([z]) == h
    u = cnt("UncachedCompile")
    lazyxla.sync()
    assert cnt("UncachedCompile") - u == 1
    torch.testing.assert_close(z.cpu(), torch.tanh(x.cpu() * 2.5) - 1)


# ---------------------------------------------------------------------------------------
# R14: the metrics API.
def _compile_something():
    x = torch.randn(fresh()).to(DEV)
    y = x * 2 - 3  # noqa: F841
    lazyxla.sync()
    lazyxla.wait_device_ops()


def test_metrics_report_layout():
    _compile_something()
    report = met.metrics_report()
    assert isinstance(report, str)
    m = re.search(r"^Metric: CompileTime\n  TotalSamples: (\d+)\n  Accumulator: (\S+)\n", report, re.M)
    assert m, report
    assert int(m.group(1)) == met.metric_data("CompileTime")[0]
    block = report[m.start():].split("\nMetric: ")[0].split("\nCounter: ")[0]
    assert re.search(r"^  Percentiles: 1%=.*; 50%=.*; 99%=", block, re.M), block
    c = re.search(r"^Counter: UncachedCompile\n  Value: (\d+)$", report, re.M)
    assert c, report
    assert int(c.group(1)) == met.counter_value("UncachedCompile")
    c = re.search(r"^Counter: MarkStep\n  Value: (\d+)$", report, re.M)
    assert c and int(c.group(1)) == met.counter_value("MarkStep")
    # Every metric and counter name appears as a block header.
    for name in met.metric_names():
        assert f"Metric: {name}\n" in report
    for name in met.counter_names():
        assert f"Counter: {name}\n" in report


def test_short_metrics_report():
    _compile_something()
    short = met.short_metrics_report()
    assert "Metric: CompileTime\n" in short
    assert "Counter: MarkStep\n" in short
    assert "  TotalSamples:" in short
    assert "  Value:" in short


def test_counter_value_of_unknown_counter_is_none():
    assert met.counter_value("NoSuchCounter") is None
    assert met.metric_data("NoSuchMetric") is None
    assert "NoSuchCounter" not in met.counter_names()


def test_counter_and_metric_names():
    _compile_something()
    names = met.counter_names()
    for want in ("UncachedCompile", "MarkStep", "CreateXlaTensor", "ExecuteComputation"):
        assert want in names
    mnames = met.metric_names()
    for want in ("CompileTime", "ExecuteTime", "TransferToDeviceTime", "TensorsGraphSize"):
        assert want in mnames


def test_metric_data_is_a_three_tuple():
    _compile_something()
    data = met.metric_data("CompileTime")
    assert isinstance(data, tuple) and len(data) == 3
    total, acc, pts = data
    assert isinstance(total, int) and total >= 1
    assert acc > 0
    assert isinstance(pts, list) and 1 <= len(pts) <= total
    ts, value = pts[-1]
    assert value > 0
    assert acc >= value


def test_counters_count_ops_and_tensors():
    n = fresh()
    x = torch.randn(n).to(DEV)
    c0 = cnt("CreateXlaTensor")
    y = x + x
    z = y * y
    assert cnt("CreateXlaTensor") - c0 == 2
    d0 = cnt("DestroyXlaTensor")
    del y, z
    gc.collect()
    assert cnt("DestroyXlaTensor") - d0 == 2


def test_mark_step_counts_each_sync():
    m0 = cnt("MarkStep")
    for _ in range(3):
        lazyxla.sync()
    assert cnt("MarkStep") - m0 == 3


def test_clear_counters_and_metrics():
    _compile_something()
    assert met.counter_value("MarkStep") is not None
    met.clear_counters()
    assert met.counter_value("MarkStep") is None
    assert met.counter_value("UncachedCompile") is None
    assert "Counter: MarkStep" not in met.metrics_report()
    lazyxla.wait_device_ops()
    met.clear_metrics()
    assert met.metric_data("CompileTime") is None
    assert "CompileTime" not in met.metric_names()
    assert "Metric: CompileTime" not in met.metrics_report()
    # Counting starts again from zero.
    _compile_something()
    assert met.counter_value("MarkStep") == 1
    assert met.counter_value("UncachedCompile") == 1
    assert met.metric_data("CompileTime")[0] == 1
