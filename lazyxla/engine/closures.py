"""Step closures: functions that run after a step's program, with the step's values.

``add_step_closure(fn, args=(), run_async=False)`` queues ``fn(*args)`` for the end of the
current step (torch_xla's ``xm.add_step_closure``). At the end of the next ``sync()``, after
the step's program was dispatched and every synced tensor holds its new buffer (the
``after_step`` event), the queued closures run: first the ``run_async`` ones are handed, in
the order they were added, to one background thread, which runs them one after another; then
the others run in this thread, in the order they were added. Reading a tensor in a closure
waits for the step's program and compiles nothing (the tensor is device data). A closure
that raises stops the sync with its error (the closures after it are dropped); an async
closure that raised is reported, as a RuntimeError chained to it, by the next
``add_step_closure(..., run_async=True)`` of a later step. A closure added while closures
run belongs to the next step. At the interpreter's exit, async closures handed off still run.

May touch: its own queues and background thread.
"""
from __future__ import annotations

import atexit
import queue
import threading

_LOCK = threading.Lock()
_SYNC: list = []    # closures for the end of the step, run in the syncing thread
_ASYNC: list = []   # closures for the end of the step, run on the background thread


class _AsyncRunner:
    """One background thread that runs async closures in order; it stops when idle for a while
    and starts again on demand. The first error stops it; the next hand-off reports it."""

    IDLE_SECONDS = 3.0

    def __init__(self, max_queue: int = 100):
        self.queue: queue.Queue = queue.Queue(max_queue)
        self.errors: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.thread = None

    def _loop(self):
        while True:
            try:
                fn = self.queue.get(timeout=self.IDLE_SECONDS)
            except queue.Empty:
                with self.lock:
                    if self.queue.empty():
                        self.thread = None
                        return
                continue
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - kept and reported at the next hand-off
                self.errors.put(e)
                with self.lock:
                    self.thread = None
                return
            finally:
                self.queue.task_done()

    def run(self, fn):
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                try:
                    err = self.errors.get_nowait()
                except queue.Empty:
                    err = None
                if err is not None:
                    raise RuntimeError("lazyxla: cannot run an asynchronous step closure: an earlier one "
                                       f"raised {type(err).__name__}: {err}") from err
                self.thread = threading.Thread(target=self._loop, name="lazyxla-step-closures", daemon=True)
                self.thread.start()
            self.queue.put(fn)

    def wait(self):
        """Block until every handed-off closure has run (or the thread stopped on an error)."""
        while self.thread is not None and self.thread.is_alive() and self.queue.unfinished_tasks:
            self.thread.join(timeout=0.05)


_RUNNER = _AsyncRunner()
atexit.register(lambda: _RUNNER.wait())


def add_step_closure(fn, args=(), run_async: bool = False) -> None:
    """Run ``fn(*args)`` after the current step's program (at the end of the next ``sync()``);
    ``run_async=True`` runs it on a background thread instead, after the step's device work
    was dispatched, so the next step's tracing does not wait for it."""
    if not callable(fn):
        raise TypeError(f"lazyxla.add_step_closure: {fn!r} is not callable")
    args = tuple(args)
    with _LOCK:
        (_ASYNC if run_async else _SYNC).append((fn, args))


def take_closures() -> tuple:
    """The closures queued so far, removed from the queue: (sync ones, async ones), each a list
    of (fn, args). A graph capture (``replay``) keeps those its step added, for every replay."""
    with _LOCK:
        out = (_SYNC[:], _ASYNC[:])
        _SYNC.clear()
        _ASYNC.clear()
    return out


def queue_closures(sync_ones, async_ones) -> None:
    """Queue closures taken by ``take_closures`` again, for the end of the current step."""
    with _LOCK:
        _SYNC.extend(sync_ones)
        _ASYNC.extend(async_ones)


def pending_closures() -> int:
    """How many closures wait for the end of the step."""
    return len(_SYNC) + len(_ASYNC)


def run_step_closures() -> None:
    """Run the closures queued for this step (the ``after_step`` event calls it)."""
    if not _SYNC and not _ASYNC:
        return
    with _LOCK:
        async_ones, sync_ones = _ASYNC[:], _SYNC[:]
        _ASYNC.clear()
        _SYNC.clear()
    for fn, args in async_ones:
        _RUNNER.run(lambda fn=fn, args=args: fn(*args))
    for fn, args in sync_ones:
        fn(*args)


def wait_async_closures() -> None:
    """Block until the asynchronous closures handed off so far have run."""
    _RUNNER.wait()


class StepClosures:
    """The subscriber ``lazyxla`` installs on ``events``: runs the closures after each step."""

    def after_step(self):
        run_step_closures()
