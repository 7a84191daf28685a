"""The metrics arena: counters, sampled metrics and torch_xla-style reports.

It keeps its own state and touches nothing else (no torch, no jax; of lazyxla only its settings), so
every part of lazyxla can record into it cheaply. The public face is `lazyxla.debug.metrics`.
A count kept lazily by a hot path is settled by the functions in ``BEFORE_READ`` before any
counter is read (the arena's dead tensors: ``DestroyXlaTensor``).
"""

import collections
import contextlib
import math
import threading
import time

from .config import env_int, env_str

# Counters: name -> int. The hot path is a single dict update. Under CPython's GIL
# `d[k] = d.get(k, 0) + n` can only lose an increment if a thread switch lands between the get
# and the store; we accept that for speed (counters are diagnostics, not accounting).
COUNTERS = {}

MAX_SAMPLES = env_int("XLA_METRICS_SAMPLES", 1024)


def _read_percentiles(text):
    pcts = sorted(float(p) for p in text.split(":"))
    for p in pcts:
        if not 0.0 < p < 1.0:
            raise ValueError(f"Invalid percentile: {p}")
    return pcts


PERCENTILES = _read_percentiles(
    env_str("XLA_METRICS_PERCENTILES", "0.01:0.05:0.1:0.2:0.5:0.8:0.9:0.95:0.99"))

SHORT_COUNTERS = ["CachedCompile", "MarkStep", "DynamoSyncInputExecuteTime"]
SHORT_METRICS = ["CompileTime", "ExecuteTime", "ExecuteReplicatedTime",
                 "TransferToDeviceTime", "TransferFromDeviceTime"]
_PREFIX = "pt-xla-profiler"


class _Metric:
    __slots__ = ("kind", "count", "acc", "samples")

    def __init__(self, kind):
        self.kind = kind
        self.count = 0
        self.acc = 0.0
        self.samples = collections.deque(maxlen=max(1, MAX_SAMPLES))  # (timestamp_ns, value)


_METRICS = {}
_LOCK = threading.Lock()  # guards _METRICS and every _Metric (executions finish on other threads)

now_ns = time.perf_counter_ns  # for measuring durations on hot paths


def counter_inc(name, n=1):
    COUNTERS[name] = COUNTERS.get(name, 0) + n


# Counts that a hot path settles only when someone reads the counters (the arena counts the
# tensors that died since it last looked): each function here runs before every read.
BEFORE_READ: list = []


def _settle():
    for settle in BEFORE_READ:
        settle()


def _metric(name, kind):
    """The metric called name, made on first use (caller holds _LOCK)."""
    m = _METRICS.get(name)
    if m is None:
        if kind not in _FORMATTERS:
            raise ValueError(f"unknown metric kind {kind!r}")
        m = _METRICS[name] = _Metric(kind)
    return m


def metric_add(name, value, kind="value", timestamp_ns=None):
    """Add one sample. kind is "time" (ns), "bytes" or "value"; the first add fixes it."""
    ts = time.time_ns() if timestamp_ns is None else timestamp_ns
    with _LOCK:
        m = _metric(name, kind)
        m.count += 1
        m.acc += value
        m.samples.append((ts, value))


def metric_add_many(name, values, kind="value"):
    """Add several samples at once (one lock; the hot path batches per-op samples)."""
    if not values:
        return
    ts = time.time_ns()
    with _LOCK:
        m = _metric(name, kind)
        m.count += len(values)
        m.acc += sum(values)
        m.samples.extend((ts, v) for v in values)


# Samples taken on hot paths (one per traced op) are appended to a plain list, with no lock
# and no timestamp; they join their metric at the next read (or flush_pending()).
_PENDING = {}


def pending_samples(name, kind):
    """The list that a hot path appends raw samples of metric ``name`` to."""
    entry = _PENDING.get(name)
    if entry is None:
        entry = _PENDING[name] = (kind, [])
    return entry[1]


def flush_pending(at_least: int = 1):
    """Move pending samples into their metrics (for each metric with ``at_least`` of them)."""
    for name, (kind, values) in list(_PENDING.items()):
        if len(values) >= at_least:
            batch = values[:]
            del values[:len(batch)]
            metric_add_many(name, batch, kind)


@contextlib.contextmanager
def timed(name):
    t0 = now_ns()
    try:
        yield
    finally:
        metric_add(name, now_ns() - t0, "time")


def counter_value(name):
    _settle()
    v = COUNTERS.get(name)
    return v if v else None  # torch_xla hides zero counters


def _live_counters():
    _settle()
    # dict.copy() runs in C without releasing the GIL: a consistent snapshot.
    return sorted((k, v) for k, v in COUNTERS.copy().items() if v)


def counter_names():
    return [k for k, _ in _live_counters()]


def _snapshot(name):
    m = _METRICS.get(name)
    if m is None or m.count == 0:
        return None
    return m.kind, m.count, m.acc, list(m.samples)


def _live_metrics(names=None):
    flush_pending()
    with _LOCK:
        wanted = sorted(_METRICS) if names is None else sorted(set(names) & set(_METRICS))
        snaps = [(n, _snapshot(n)) for n in wanted]
    return [(n, s) for n, s in snaps if s is not None]


def metric_names():
    return [n for n, _ in _live_metrics()]


def metric_data(name):
    """(total_samples, accumulator, [(timestamp_seconds, value), ...]) or None."""
    flush_pending()
    with _LOCK:
        snap = _snapshot(name)
    if snap is None:
        return None
    _, count, acc, samples = snap
    return count, acc, [(ts / 1e9, v) for ts, v in samples]


def clear_counters():
    _settle()  # deaths before the clear are not counted after it
    COUNTERS.clear()


def clear_metrics():
    flush_pending()
    with _LOCK:
        for m in _METRICS.values():  # the kind stays fixed
            m.count, m.acc = 0, 0.0
            m.samples.clear()


# ---- value formatting (torch_xla's MetricFnTime / MetricFnBytes / MetricFnValue) ----

_TIME_PARTS = (("d", 86400e9, 2, 0), ("h", 3600e9, 2, 0), ("m", 60e9, 2, 0),
               ("s", 1e9, 2, 0), ("ms", 1e6, 3, 0), ("us", 1e3, 7, 3))


def format_time(ns):
    # Leading parts are omitted while below 1. Like torch_xla, a part is *rounded* when printed
    # but only its floor is subtracted, so 412.7ms prints as "413ms700.000us".
    out, started = [], False
    for i, (suffix, scale, width, prec) in enumerate(_TIME_PARTS):
        part = ns / scale
        if part >= 1.0 or started or i == len(_TIME_PARTS) - 1:
            out.append("%0*.*f%s" % (width, prec, part, suffix))
            ns -= math.floor(part) * scale
            started = True
    return "".join(out)


def format_bytes(value, digits=2, whole_bytes=False):
    """``value`` bytes in the largest unit it reaches (B, KB, MB, GB, TB, PB; steps of 1024) with
    ``digits`` decimals: ``1.50KB`` (torch_xla's report format). ``whole_bytes``: counts under
    1KB print without decimals (``512B``)."""
    suffixes = ("B", "KB", "MB", "GB", "TB", "PB")
    i = 0
    while i + 1 < len(suffixes) and value >= 1024.0:
        value /= 1024.0
        i += 1
    return "%.*f%s" % (0 if whole_bytes and i == 0 else digits, value, suffixes[i])


def format_value(value):
    return "%.2f" % value


_FORMATTERS = {"time": format_time, "bytes": format_bytes, "value": format_value}


# ---- reports ----

def _metric_block(name, snap):
    kind, count, acc, samples = snap
    fmt = _FORMATTERS[kind]
    lines = [f"Metric: {name}", f"  TotalSamples: {count}", f"  Accumulator: {fmt(acc)}"]
    delta_ns = samples[-1][0] - samples[0][0]
    if delta_ns > 0:  # rates are over the retained window only
        total = sum(v for _, v in samples)
        lines.append(f"  ValueRate: {fmt(1e6 * (total / (delta_ns / 1000.0)))} / second")
        lines.append("  Rate: %g / second" % (1e6 * (len(samples) / (delta_ns / 1000.0))))
    values = sorted(v for _, v in samples)
    pcts = ["%g%%=%s" % (p * 100.0, fmt(values[min(int(p * len(values)), len(values) - 1)]))
            for p in PERCENTILES]
    lines.append("  Percentiles: " + "; ".join(pcts))
    return lines


def _counter_block(name, value):
    return [f"Counter: {name}", f"  Value: {value}"]


def _join(lines):
    return "".join(line + "\n" for line in lines)


def metrics_report():
    lines = []
    for name, snap in _live_metrics():
        lines += _metric_block(name, snap)
    for name, value in _live_counters():
        lines += _counter_block(name, value)
    return _join(lines)


def short_metrics_report(counter_names=None, metric_names=None):
    """Only the named metrics and counters (torch_xla's defaults when empty), then every aten::
    counter. torch_xla would print an aten:: counter twice if it is also named; we print it once."""
    counter_names = set(counter_names or SHORT_COUNTERS)
    lines = []
    for name, snap in _live_metrics(metric_names or SHORT_METRICS):
        lines += _metric_block(name, snap)
    counters = _live_counters()
    for name, value in counters:
        if name in counter_names:
            lines += _counter_block(name, value)
    for name, value in counters:
        if name.startswith("aten::") and name not in counter_names:
            lines += _counter_block(name, value)
    return _join(lines)


def executed_fallback_ops():
    return [name for name, _ in _live_counters() if name.startswith("aten::")]


def performance_report(warmup_steps=10):
    """The pt-xla-profiler lines that apply now (torch_xla's CreatePerformanceReport)."""
    steps = COUNTERS.get("MarkStep", 0)
    out = []
    for metric, warmup in (("CompileTime", warmup_steps), ("TransferFromDeviceTime", 0)):
        data = metric_data(metric)
        if data and steps > warmup and data[0] / steps > 0.5:
            out.append(f"{_PREFIX}: {metric} too frequent: {data[0]} counts during {steps} steps")
    for metric, limit_ns in (("CompileTime", 300e9), ("ExecuteTime", 30e9)):
        data = metric_data(metric)
        longest = max((v for _, v in data[2]), default=0.0) if data else 0.0
        if longest > limit_ns:
            out.append(f"{_PREFIX}: {metric} too slow: longest instance took "
                       f"{format_time(longest)}. Please open a GitHub issue with the graph dump "
                       "for our team to optimize.")
    ops = [n for n in executed_fallback_ops() if n != "aten::_local_scalar_dense"]
    if ops:
        out.append(f"{_PREFIX}: Op(s) not lowered: {''.join(n + ', ' for n in ops)} Please open "
                   "a GitHub issue with the above op lowering requests.")
    return out
