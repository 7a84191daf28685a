"""``lazyxla.debug.profiler``: torch_xla's ``torch_xla.debug.profiler`` names, on JAX's profiler.

- ``start_trace(log_dir)`` / ``stop_trace()``: trace the device and the host (``jax.profiler``,
  with a Perfetto trace) into ``log_dir``. ``stop_trace`` also writes, beside the trace, the
  text of every program lazyxla has compiled (``log_dir/lazyxla_programs/<module>.hlo.txt``,
  after XLA's passes: the names the trace's ops carry), each op's ``op_name`` naming the ATen
  op and the user's line that recorded it (``aten.mm at train.py:42``), so that
  ``lazyxla profile log_dir`` (``debug.profile``) can say which line each device op's time
  belongs to.
- ``Trace(name)``: a named span on the host's timeline (``jax.profiler.TraceAnnotation``).
- ``StepTrace(name, step_num=None)``: a training step's span (``StepTraceAnnotation``); on exit
  it syncs (``lazyxla.sync()``), as torch_xla's does.
- ``start_server(port)``: JAX's profiler server, for a profiler that attaches from outside.

May touch: JAX's profiler session, the files under ``log_dir``.
"""
from __future__ import annotations

import os

import jax

from ..compiler.cache import computation_cache
from ..engine.executor import sync, wait_device_ops
from ..files import write_atomic

PROGRAMS_DIR = "lazyxla_programs"
_active = [None]  # the log_dir of the trace being taken


def start_trace(log_dir: str, create_perfetto_trace: bool = True) -> None:
    """Start tracing the device and the host into ``log_dir`` (torch_xla's ``start_trace``), once
the programs already dispatched have run."""
    if _active[0] is not None:
        raise RuntimeError(f"lazyxla.debug.profiler: a trace into {_active[0]} is being taken already")
    os.makedirs(log_dir, exist_ok=True)
    wait_device_ops()  # the programs before it run outside the trace
    jax.profiler.start_trace(log_dir, create_perfetto_trace=create_perfetto_trace)
    _active[0] = log_dir


def stop_trace() -> str:
    """Wait for the programs in flight, stop the trace, and write the compiled programs' text
    beside it; returns the log directory."""
    log_dir = _active[0]
    if log_dir is None:
        raise RuntimeError("lazyxla.debug.profiler.stop_trace: no trace was started (start_trace)")
    try:
        wait_device_ops()
    finally:
        jax.profiler.stop_trace()
        _active[0] = None
    write_programs(log_dir)
    return log_dir


def write_programs(log_dir: str) -> list:
    """Each program in the compilation cache as its module's text after XLA's passes, one file a
    module under ``log_dir/lazyxla_programs``; the paths written."""
    out_dir = os.path.join(log_dir, PROGRAMS_DIR)
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for prog in computation_cache().values():
        try:
            text = prog.executable.as_text()
        except Exception:  # noqa: BLE001 - a program loaded without its text: its ops stay unnamed
            continue
        name = text.split(None, 2)[1].rstrip(",") if text.startswith("HloModule ") else None
        if not name:
            continue
        path = os.path.join(out_dir, f"{name}.hlo.txt")
        write_atomic(path, text.encode())
        written.append(path)
    return written


class Trace:
    """A named span of the host's work (torch_xla's ``xp.Trace``)."""

    def __init__(self, name: str, **kwargs):
        self._span = jax.profiler.TraceAnnotation(name, **kwargs)

    def __enter__(self):
        self._span.__enter__()
        return self

    def __exit__(self, *exc):
        return self._span.__exit__(*exc)


class StepTrace:
    """A training step's span (torch_xla's ``xp.StepTrace``): the step's program is run on exit
    (``lazyxla.sync()``), so the step's device time follows its span."""

    def __init__(self, name: str, step_num=None, **kwargs):
        self._span = jax.profiler.StepTraceAnnotation(name, step_num=step_num, **kwargs)

    def __enter__(self):
        self._span.__enter__()
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            try:
                sync()
            except BaseException:
                self._span.__exit__(*exc)
                raise
        return self._span.__exit__(*exc)


def start_server(port: int):
    """JAX's profiler server on ``port`` (torch_xla's ``xp.start_server``)."""
    return jax.profiler.start_server(port)
