"""Formatting and semantics of the metrics arena (torch_xla's report layout, R14)."""

import threading

import pytest

import lazyxla.metrics as m


@pytest.fixture(autouse=True)
def fresh_arena(monkeypatch):
    monkeypatch.setattr(m, "COUNTERS", {})
    monkeypatch.setattr(m, "_METRICS", {})
    monkeypatch.setattr(m, "_PENDING", {})  # samples other tests' ops left to flush


S = 1_000_000_000  # one second in ns


# ---- value formats ----

@pytest.mark.parametrize("ns, text", [
    (0, "000.000us"),
    (999, "000.999us"),
    (1500, "001.500us"),
    (1_000_000, "001ms000.000us"),
    (412_031_212, "412ms031.212us"),
    (62_003_004_000, "01m02s003ms004.000us"),
    (90_001 * S, "01d01h00m01s000ms000.000us"),
    (3 * S, "03s000ms000.000us"),
    # torch_xla rounds the printed part but subtracts only its floor
    (412_700_000, "413ms700.000us"),
])
def test_format_time(ns, text):
    assert m.format_time(ns) == text


@pytest.mark.parametrize("value, text", [
    (0, "0.00B"), (1023, "1023.00B"), (1024, "1.00KB"), (1536, "1.50KB"),
    (3 * 1024 ** 2, "3.00MB"), (5 * 1024 ** 3, "5.00GB"), (2 * 1024 ** 6, "2048.00PB"),
])
def test_format_bytes(value, text):
    assert m.format_bytes(value) == text


def test_format_value():
    assert m.format_value(3) == "3.00"
    assert m.format_value(2.5) == "2.50"
    assert m.format_value(1 / 3) == "0.33"


# ---- full report ----

def test_full_report_layout():
    m.metric_add("CompileTime", 400_000_000, "time", timestamp_ns=1 * S)
    m.metric_add("CompileTime", 12_031_212, "time", timestamp_ns=3 * S)
    m.metric_add("InboundData", 2048, "bytes", timestamp_ns=5 * S)
    m.counter_inc("CachedCompile", 17)
    m.counter_inc("CachedCompile")
    m.counter_inc("Alpha")
    m.counter_inc("Zero", 0)
    t_lo, t_hi = "012ms031.212us", "400ms000.000us"
    expected = (
        "Metric: CompileTime\n"
        "  TotalSamples: 2\n"
        "  Accumulator: 412ms031.212us\n"
        "  ValueRate: 206ms015.606us / second\n"
        "  Rate: 1 / second\n"
        f"  Percentiles: 1%={t_lo}; 5%={t_lo}; 10%={t_lo}; 20%={t_lo}; 50%={t_hi}; "
        f"80%={t_hi}; 90%={t_hi}; 95%={t_hi}; 99%={t_hi}\n"
        "Metric: InboundData\n"
        "  TotalSamples: 1\n"
        "  Accumulator: 2.00KB\n"
        "  Percentiles: 1%=2.00KB; 5%=2.00KB; 10%=2.00KB; 20%=2.00KB; 50%=2.00KB; "
        "80%=2.00KB; 90%=2.00KB; 95%=2.00KB; 99%=2.00KB\n"
        "Counter: Alpha\n"
        "  Value: 1\n"
        "Counter: CachedCompile\n"
        "  Value: 18\n"
    )
    assert m.metrics_report() == expected


def test_rate_uses_general_number_format():
    for i in range(4):
        m.metric_add("V", 1.0, timestamp_ns=i * 3 * S)  # 4 samples over 9 s
    report = m.metrics_report()
    assert "  ValueRate: 0.44 / second\n" in report
    assert "  Rate: 0.444444 / second\n" in report


def test_percentiles_floor_index_over_sorted_samples():
    for v in (7, 3, 10, 1, 5, 9, 2, 8, 6, 4):
        m.metric_add("V", v, timestamp_ns=S)
    assert m.metrics_report().splitlines()[-1] == (
        "  Percentiles: 1%=1.00; 5%=1.00; 10%=2.00; 20%=3.00; 50%=6.00; "
        "80%=9.00; 90%=10.00; 95%=10.00; 99%=10.00")


def test_percentiles_floor_not_round():
    for v in (4, 7, 1, 6, 2, 5, 3):  # p*7 = .07 .35 .7 1.4 3.5 5.6 6.3 6.65 6.93
        m.metric_add("V", v, timestamp_ns=S)
    assert m.metrics_report().splitlines()[-1] == (
        "  Percentiles: 1%=1.00; 5%=1.00; 10%=1.00; 20%=2.00; 50%=4.00; "
        "80%=6.00; 90%=7.00; 95%=7.00; 99%=7.00")


def test_custom_percentiles(monkeypatch):
    monkeypatch.setattr(m, "PERCENTILES", m._read_percentiles("0.75:0.25"))
    for v in (1, 2, 3, 4):
        m.metric_add("V", v, timestamp_ns=S)
    assert m.metrics_report().splitlines()[-1] == "  Percentiles: 25%=2.00; 75%=4.00"
    with pytest.raises(ValueError):
        m._read_percentiles("0.5:1.0")


def test_sorted_by_name_and_zero_counts_skipped():
    for name in ("b", "C", "a"):
        m.metric_add(name, 1.0)
        m.counter_inc(name)
    m.counter_inc("z", 0)
    assert m.metric_names() == ["C", "a", "b"]
    assert m.counter_names() == ["C", "a", "b"]
    heads = [l for l in m.metrics_report().splitlines() if not l.startswith("  ")]
    assert heads == ["Metric: C", "Metric: a", "Metric: b",
                     "Counter: C", "Counter: a", "Counter: b"]
    assert m.counter_value("z") is None


def test_kind_fixed_by_first_add():
    m.metric_add("X", 1_000_000, "time")
    m.metric_add("X", 1_000_000, "bytes")
    assert "  Accumulator: 002ms000.000us\n" in m.metrics_report()
    with pytest.raises(ValueError):
        m.metric_add("Y", 1, "seconds")


def test_timed_records_elapsed_time():
    with m.timed("LazyTracing"):
        sum(range(1000))
    count, acc, samples = m.metric_data("LazyTracing")
    assert count == 1 and acc > 0 and samples[0][1] == acc
    assert m.metrics_report().splitlines()[2].endswith("us")


# ---- accessors and clearing ----

def test_metric_data_tuple_and_ring_buffer(monkeypatch):
    monkeypatch.setattr(m, "MAX_SAMPLES", 3)
    for i in range(1, 6):
        m.metric_add("V", float(i), timestamp_ns=i * S // 2)
    assert m.metric_data("V") == (5, 15.0, [(1.5, 3.0), (2.0, 4.0), (2.5, 5.0)])
    assert m.metric_data("missing") is None
    report = m.metrics_report()
    assert "  TotalSamples: 5\n  Accumulator: 15.00\n" in report
    assert "  ValueRate: 12.00 / second\n  Rate: 3 / second\n" in report  # window only


def test_counter_value_and_clear_counters():
    assert m.counter_value("MarkStep") is None
    m.counter_inc("MarkStep")
    m.counter_inc("MarkStep", 2)
    assert m.counter_value("MarkStep") == 3
    m.clear_counters()
    assert m.counter_value("MarkStep") is None
    assert m.counter_names() == []
    assert m.metrics_report() == ""


def test_clear_metrics_keeps_counters():
    m.metric_add("CompileTime", 5, "time")
    m.counter_inc("MarkStep")
    m.clear_metrics()
    assert m.metric_data("CompileTime") is None
    assert m.metric_names() == []
    assert m.metrics_report() == "Counter: MarkStep\n  Value: 1\n"
    m.metric_add("CompileTime", 2000, "value")  # kind survives the clear
    assert m.metric_data("CompileTime")[:2] == (1, 2000.0)
    assert "  Accumulator: 002.000us\n" in m.metrics_report()


def test_metric_add_is_thread_safe(monkeypatch):
    monkeypatch.setattr(m, "MAX_SAMPLES", 100_000)

    def work():
        for _ in range(2000):
            m.metric_add("T", 1.0)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    count, acc, samples = m.metric_data("T")
    assert (count, acc, len(samples)) == (16000, 16000.0, 16000)


# ---- short report ----

def _populate_short():
    for name in ("CompileTime", "ExecuteTime", "LazyTracing"):
        m.metric_add(name, 1000, "time", timestamp_ns=S)
    for name in ("CachedCompile", "MarkStep", "UncachedCompile", "aten::nonzero", "aten::_ctc_loss"):
        m.counter_inc(name)


def _heads(report):
    return [l for l in report.splitlines() if not l.startswith("  ")]


def test_short_report_defaults_and_aten_counters():
    _populate_short()
    assert _heads(m.short_metrics_report()) == [
        "Metric: CompileTime", "Metric: ExecuteTime",
        "Counter: CachedCompile", "Counter: MarkStep",
        "Counter: aten::_ctc_loss", "Counter: aten::nonzero"]
    assert m.short_metrics_report([], []) == m.short_metrics_report()


def test_short_report_custom_names():
    _populate_short()
    report = m.short_metrics_report(["UncachedCompile", "aten::nonzero"], ["LazyTracing"])
    assert _heads(report) == [
        "Metric: LazyTracing", "Counter: UncachedCompile", "Counter: aten::nonzero",
        "Counter: aten::_ctc_loss"]
    assert report.count("Counter: aten::nonzero") == 1


def test_executed_fallback_ops():
    _populate_short()
    m.counter_inc("aten::zero_count", 0)
    assert m.executed_fallback_ops() == ["aten::_ctc_loss", "aten::nonzero"]


# ---- performance report ----

def _steps(n):
    m.counter_inc("MarkStep", n)


def _samples(name, n, value=1.0):
    for _ in range(n):
        m.metric_add(name, value, "time")


def test_compile_too_frequent_after_warmup():
    _steps(10)
    _samples("CompileTime", 10)
    assert m.performance_report() == []  # still warming up
    _steps(1)
    assert m.performance_report() == [
        "pt-xla-profiler: CompileTime too frequent: 10 counts during 11 steps"]
    assert m.performance_report(warmup_steps=20) == []


def test_compile_frequency_threshold():
    _steps(12)
    _samples("CompileTime", 6)  # exactly 0.5 is not too frequent
    assert m.performance_report() == []
    _samples("CompileTime", 1)
    assert m.performance_report() == [
        "pt-xla-profiler: CompileTime too frequent: 7 counts during 12 steps"]


def test_transfer_from_device_too_frequent_without_warmup():
    _samples("TransferFromDeviceTime", 1)
    assert m.performance_report() == []  # no MarkStep yet
    _steps(2)
    assert m.performance_report() == []  # 1/2 is not > 0.5
    _samples("TransferFromDeviceTime", 1)
    assert m.performance_report() == [
        "pt-xla-profiler: TransferFromDeviceTime too frequent: 2 counts during 2 steps"]


def test_ops_not_lowered_line():
    m.counter_inc("aten::nonzero")
    m.counter_inc("aten::_ctc_loss")
    m.counter_inc("aten::_local_scalar_dense")
    assert m.performance_report() == [
        "pt-xla-profiler: Op(s) not lowered: aten::_ctc_loss, aten::nonzero,  "
        "Please open a GitHub issue with the above op lowering requests."]


def test_too_slow_lines():
    m.metric_add("ExecuteTime", 30 * S, "time")
    m.metric_add("CompileTime", 300 * S, "time")
    assert m.performance_report() == []  # limits are strict
    m.metric_add("ExecuteTime", 31 * S, "time")
    assert m.performance_report() == [
        "pt-xla-profiler: ExecuteTime too slow: longest instance took 31s000ms000.000us. "
        "Please open a GitHub issue with the graph dump for our team to optimize."]


# ---- public module ----

def test_debug_metrics_public_api():
    import lazyxla.debug.metrics as met
    m.metric_add("CompileTime", 5, "time")
    m.counter_inc("aten::nonzero")
    assert met.metric_names() == ["CompileTime"]
    assert met.counter_value("aten::nonzero") == 1
    assert met.executed_fallback_ops() == ["aten::nonzero"]
    assert met.metrics_report() == m.metrics_report()
    assert "Counter: aten::nonzero" in met.short_metrics_report()
    met.clear_all()
    assert met.metrics_report() == "" and met.counter_names() == [] and met.metric_names() == []
