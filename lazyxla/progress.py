"""Reporting a training run: ``RateTracker``, ``master_print``, the one-line training and test
updates, and a TensorBoard summary writer (torch_xla's ``xm.RateTracker``, ``xm.master_print``
and ``torch_xla.test.test_utils``).

``RateTracker(smooth_factor=None)``: ``add(count)`` counts examples; ``rate()`` is the rate
since the previous ``rate()`` call, smoothed with the previous rate
(``(1 - s) * current + s * previous``, ``s`` from ``RATE_TRACKER_SMOOTHING``, default 0.4);
``global_rate()`` is the count over the time since the tracker was made. ``master_print``
prints only in the process of global rank 0 (``local=True``: rank 0 on each machine).
``summary_writer(logdir)`` is None without a ``logdir`` (every ``write_summary`` to None does
nothing, as in torch_xla); with one it is TensorBoard's ``SummaryWriter``, and a clear error
if neither ``tensorboard`` nor ``tensorboardX`` is installed.

May touch: standard output (or the given file), the summary writer's directory.
"""
from __future__ import annotations

import sys
import time
from datetime import datetime

from . import metrics
from .config import env_str
from .distributed import world

__all__ = ["RateTracker", "is_master", "master_print", "print_training_update", "print_test_update",
           "summary_writer", "write_summary", "close_summary_writer"]


class RateTracker:
    """Examples per second: the smoothed rate since the last ``rate()``, and the global rate."""

    def __init__(self, smooth_factor: float | None = None):
        if smooth_factor is None:
            smooth_factor = float(env_str("RATE_TRACKER_SMOOTHING", "0.4") or 0.4)
        self.smooth_factor = smooth_factor
        self._start = time.time()
        self._partial_time = self._start
        self._partial_count = 0.0
        self._partial_rate = None
        self._count = 0.0

    def add(self, count: float) -> None:
        self._count += count

    def rate(self) -> float:
        now = time.time()
        delta = now - self._partial_time
        if delta <= 0:
            return 0.0
        current = self._count / delta
        rate = current if self._partial_rate is None else \
            (1 - self.smooth_factor) * current + self.smooth_factor * self._partial_rate
        self._partial_count += self._count
        self._count = 0.0
        self._partial_time = now
        self._partial_rate = rate
        return rate

    def global_rate(self) -> float:
        delta = time.time() - self._start
        return (self._partial_count + self._count) / delta if delta > 0 else 0.0


def is_master(local: bool = True) -> bool:
    """Whether this process is rank 0 (on its machine with ``local``, of the job without)."""
    return (world.local_ordinal() if local else world.global_ordinal()) == 0


def master_print(*args, fd=None, local: bool = False, flush: bool = False) -> None:
    """``print`` in the process of global rank 0 only (``local=True``: rank 0 of each machine)."""
    if is_master(local=local):
        print(*args, file=sys.stdout if fd is None else fd, flush=flush)


def _device_spec(device) -> str:
    return f"{device}/{world.global_ordinal()}"


def _now() -> str:
    return datetime.now().strftime("%H:%M:%S")


def print_training_update(device, step, loss, rate, global_rate, epoch=None, summary_writer=None) -> None:
    """One line: ``| Training Device=lazyxla:0/0 Epoch=1 Step=20 Loss=0.12345 Rate=.. GlobalRate=.. Time=..``."""
    parts = ["Training", f"Device={_device_spec(device)}", f"Epoch={epoch}" if epoch is not None else None,
             f"Step={step}", f"Loss={loss:.5f}", f"Rate={rate:.2f}", f"GlobalRate={global_rate:.2f}",
             f"Time={_now()}"]
    print("|", " ".join(p for p in parts if p), flush=True)
    if summary_writer:
        write_summary(summary_writer, values={"examples/sec": rate, "average_examples/sec": global_rate})


def print_test_update(device, accuracy, epoch=None, step=None) -> None:
    """One line: ``| Test Device=lazyxla:0/0 Step=.. Epoch=.. Accuracy=98.10 Time=..``."""
    parts = ["Test", f"Device={_device_spec(device)}", f"Step={step}" if step is not None else None,
             f"Epoch={epoch}" if epoch is not None else None,
             f"Accuracy={accuracy:.2f}" if accuracy is not None else None, f"Time={_now()}"]
    print("|", " ".join(p for p in parts if p), flush=True)


def summary_writer(logdir):
    """TensorBoard's ``SummaryWriter`` for ``logdir``, or None when ``logdir`` is empty."""
    if not logdir:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise ImportError(f"lazyxla: a summary writer for logdir {logdir!r} needs TensorBoard: "
                              f"pip install tensorboard (or tensorboardX), or pass no logdir") from None
    writer = SummaryWriter(log_dir=logdir)
    write_summary(writer, 0, {"TensorboardStartTimestamp": time.time()})
    return writer


def write_summary(writer, global_step=None, values=None, write_metrics: bool = False) -> None:
    """Add each ``values`` item as a scalar; with ``write_metrics`` also every counter and each
    metric's accumulator. Nothing when ``writer`` is None."""
    if writer is None:
        return
    for k, v in (values or {}).items():
        writer.add_scalar(k, v, global_step)
    if write_metrics:
        aten_sum = 0
        for name in metrics.counter_names():
            v = metrics.counter_value(name) or 0
            if name.startswith("aten::"):
                aten_sum += v
            writer.add_scalar(name, v, global_step)
        for name in metrics.metric_names():
            data = metrics.metric_data(name)
            if data:
                writer.add_scalar(name, data[1], global_step)
        writer.add_scalar("aten_ops_sum", aten_sum, global_step)


def close_summary_writer(writer) -> None:
    if writer is not None:
        writer.flush()
        writer.close()
