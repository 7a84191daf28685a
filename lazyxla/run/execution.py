"""Running compiled programs, asynchronously (R4.4), and their failures.

JAX dispatches a program on the CPU asynchronously: the call returns its output arrays at
once and XLA's threads compute them, so tracing the next step overlaps this one. ``run``
calls a program and returns one ``Placeholder`` per output; one completion thread waits
on each program in order (on one of its outputs: an execution makes them ready together), to
record ``ExecuteTime`` and to catch a failure, which surfaces at the next
``wait_device_ops()`` or value read, naming the graph's hash. A replay's program is not
handed to the thread (``run(timed=False)``): whoever waits looks at its outputs. At most
``MAX_INFLIGHT`` programs are in flight (torch_xla's device lock allows one), so a runaway
queue cannot pin many steps' buffers.

May touch: the buffers it is given (donated ones are consumed by their program), its queue
of in-flight programs, the ``ExecuteTime`` metric and ``ExecuteComputation`` counter.
"""
from __future__ import annotations

import atexit
import threading
from collections import deque
from itertools import repeat
from operator import is_ as _is
from queue import SimpleQueue

import numpy as np

from .. import metrics
from ..ir.user_line import fmt_where

_now = metrics.now_ns
MAX_INFLIGHT = 2
_ran_and_failed = False  # a dispatched program failed while running (its outputs are not None)
_inflight = deque()  # completions not yet waited on by wait_device_ops, oldest first
_last_done = 0  # when the previous program finished (ExecuteTime counts from then if later)


class ExecutionError(RuntimeError):
    """An XLA program failed; raised at the next wait or value read. ``root``: the first
    failure's own message, when this one only followed from it."""

    def __init__(self, message, root=None):
        super().__init__(message)
        self.root = root or message


class ValueCheckError(ExecutionError):
    """A value check folded into a program failed (``lowering.program``: a probability that is
    negative, NaN or sums to zero); raised at the next sync once its program finished, at the
    latest at the next wait or value read."""


class IndexCheckError(ValueCheckError, IndexError):
    """An index out of bounds, found by a check folded into the program (``IndexError`` where
    PyTorch raises one)."""


def _check_failure(flags, checks, key_hex):
    """The error of the first failed check among ``flags`` (the program's rows of (flag, value),
    one per entry of ``checks``), or None."""
    for (flag, value), (op, where, text, kind) in zip(np.asarray(flags).tolist(), checks):
        if flag:
            at = f" at {fmt_where(where)}" if where else ""
            cls = IndexCheckError if kind == "IndexError" else ValueCheckError
            return cls(f"lazyxla: {op}{at}: {text.format(value=value)} (a value check of graph {key_hex}, "
                       f"read when it ran; LAZYXLA_CHECK_VALUES=0 turns the checks off)")
    return None


# Set by lazyxla.distributed when this process is one of a job: says which processes are lost
# when a program fails (it may wait for the job's heartbeat timeout to know). None otherwise.
explain_failure = None


class Completion:
    """One dispatched program's end: ``error`` (an ExecutionError, or None) once it is done.
    A lock held until the completion thread finishes it is the whole mechanism (cheaper than a
    Future on every sync). A *polled* completion (``outs`` given) has no thread: whoever asks
    looks at the program's outputs, which an execution makes ready together."""

    __slots__ = ("_lock", "error", "_outs", "_key_hex", "checks", "seconds")

    def __init__(self, error=None, outs=None, key_hex=None, checks=None):
        self.error = error
        self.seconds = None  # the program's execute time once done (a timed run: ``ExecuteTime``)
        self._outs = outs
        self._key_hex = key_hex
        self.checks = checks  # (flags array, the program's checks): read when it completes
        self._lock = None
        if error is None and outs is None:
            self._lock = threading.Lock()
            self._lock.acquire()

    def finish(self, error=None):
        global _ran_and_failed
        self.error = error
        if error is not None:
            _ran_and_failed = True
        self._lock.release()

    def done(self) -> bool:
        outs = self._outs
        if outs is not None:
            a = _representative(outs)
            return a is None or a.is_ready()
        return self._lock is None or not self._lock.locked()

    def wait(self):
        """The program's error or None, once it has finished."""
        global _ran_and_failed
        outs = self._outs
        if outs is not None:
            a = _representative(outs)
            self.error = None if a is None else _await((a,), self._key_hex, None)
            if self.error is None and self.checks is not None:
                self.error = _check_failure(*self.checks, self._key_hex)
            self._outs = self.checks = None
            if self.error is not None:
                _ran_and_failed = True
            return self.error
        lock = self._lock
        if lock is not None and lock.locked():
            lock.acquire()
            lock.release()
        return self.error


def _representative(outs):
    """An output of a program that is still there (the others may have been donated onward)."""
    for a in reversed(outs):
        if not a.is_deleted():
            return a
    return None


class Placeholder:
    """An output buffer of a dispatched program: the array (perhaps not computed yet) and
    the program's completion, which says whether it failed."""

    __slots__ = ("completion", "array")

    def __init__(self, completion, array):
        self.completion = completion
        self.array = array

    def get(self):
        """The computed array; waits for the program and raises if it failed."""
        err = self.completion.wait()
        if err is not None:
            try:  # reported here: the next wait_device_ops() does not report it again
                _inflight.remove(self.completion)
            except ValueError:
                pass
            # a fresh exception: re-raising the stored one would pin the caller's frames
            raise type(err)(str(err), err.root) from None
        return self.array


def resolve(d):
    """The computed jax.Array behind a storage's data; waits for its program, and raises if the
    program failed or the buffer was donated. (An input to the next program is not waited for:
    ``run``.)"""
    if type(d) is Placeholder:
        d = d.get()
    if d.is_deleted():
        raise ExecutionError("lazyxla: this device buffer was donated to a program "
                             "(lazyxla.set_buffer_donation) and no longer exists")
    return d


# ---------------------------------------------------------------------------------------
# The completion thread: waits on each program in dispatch order.
_queue = SimpleQueue()  # (completion, outputs, graph key hex, dispatch time) or None to stop
_thread = None


def _completions():
    while True:
        item = _queue.get()
        if item is None:
            return
        done, outs, key_hex, t0 = item
        a = None
        try:
            a = _representative(outs)  # one wake per program, not one per output
            err = _await(() if a is None else (a,), key_hex, t0, done)
            if err is None and done.checks is not None:
                err = _check_failure(*done.checks, key_hex)
                done.checks = None
        except BaseException as e:  # noqa: BLE001 - never leave a completion unfinished
            err = ExecutionError(_failure_text(key_hex, e))
        done.finish(err)
        # not held while waiting for the next program: a training loop's last synced step
        # (a replay loop runs no other) would keep its outputs, the gradients, on the device
        item = done = outs = a = None


def _drain_at_exit():
    if _thread is not None:
        _queue.put(None)
        _thread.join()


atexit.register(_drain_at_exit)


def _await(outs, key_hex, t0, done=None):
    """Wait until ``outs`` are computed; the failure, if the program failed. ``t0``: the
    dispatch time, for ``ExecuteTime`` and ``done.seconds`` (None: not timed)."""
    for a in outs:
        try:
            a.block_until_ready()
        except Exception as e:  # noqa: BLE001 - surfaced at the next wait or read
            if a.is_deleted():
                continue  # donated to a later program, which waits on it (and fails if it failed)
            return ExecutionError(_failure_text(key_hex, e))
    if t0 is None:
        return None
    global _last_done
    t1 = _now()
    took = t1 - max(t0, _last_done)
    metrics.metric_add("ExecuteTime", took, "time")
    _last_done = t1
    if done is not None:
        done.seconds = took / 1e9
    return None


def _failure_text(key_hex, e):
    text = f"lazyxla: execution of graph {key_hex} failed: {type(e).__name__}: {e}"
    if explain_failure is not None:
        text += explain_failure()
    return text


def wait_device_ops():
    """Wait for every scheduled execution; raise the first failure since the last wait."""
    pending = list(_inflight)
    for _ in pending:
        _inflight.popleft()
    first = None
    for c in pending:
        e = c.wait()
        if e is not None and first is None:
            first = e
    if first is not None:
        raise type(first)(str(first), first.root) from None


def raise_failed_checks():
    """At a sync: a program that already finished and failed a value check raises here (and
    is not reported again at the next wait); one still running raises at a later sync, wait
    or read."""
    for c in _inflight:
        if not c.done():
            return
        e = c.wait()  # done: no wait (a replay's completion reads its checks here)
        if isinstance(e, ValueCheckError):
            _inflight.remove(c)  # the loop ends here: removing while iterating is safe
            raise type(e)(str(e), e.root) from None


def run(executable, inputs, n_outputs: int, key_hex: str, timed: bool = True, checks=()) -> list:
    """Call ``executable`` on the buffers ``inputs`` (storage data: arrays or Placeholders);
    returns one Placeholder per output, at once. A failure to dispatch surfaces at the next
    wait or read, as one while running does. ``timed=False`` (a replay): no completion thread
    waits on the program, so no ``ExecuteTime`` sample; whoever waits looks at its outputs (a
    thread woken per program costs a replay more than its own host work). ``checks``: the
    program's value checks (``lowering.program``), whose rows are its last output: read when
    it completes, a failed one is the program's failure."""
    global _thread
    if len(_inflight) >= MAX_INFLIGHT:
        _inflight[-MAX_INFLIGHT].wait()
    done = None
    # not waited for: only a failure already known stops the program. A program that never ran
    # left placeholders without arrays; one that failed running is known by its completion.
    args = [d.array if type(d) is Placeholder else d for d in inputs]
    if _ran_and_failed or any(map(_is, args, repeat(None))):
        for d in inputs:
            err = d.completion.error if type(d) is Placeholder else None
            if err is not None:  # named after the first failure, not after the chain that led here
                done = Completion(ExecutionError(
                    f"lazyxla: graph {key_hex} not run: an input comes from a failed graph ({err.root})", err.root))
                break
    outs = None
    if done is None:
        t0 = _now()
        try:
            outs = executable(*args)
        except Exception as e:  # noqa: BLE001 - surfaced at the next wait or read
            if any(a.is_deleted() for a in args):
                e = RuntimeError("an input's device buffer was donated to a program "
                                 "(lazyxla.set_buffer_donation) and no longer exists")
            done = Completion(ExecutionError(_failure_text(key_hex, e)))
        else:
            rows = None
            if checks:  # the value checks' rows are the last output (lowering.program)
                rows, outs = (outs[-1], checks), outs[:-1]
            if not timed:
                done = Completion(outs=outs, key_hex=key_hex, checks=rows)
            else:
                done = Completion(checks=rows)
                if _thread is None:
                    _thread = threading.Thread(target=_completions, name="lazyxla-exec", daemon=True)
                    _thread.start()
                _queue.put((done, outs, key_hex, t0))
    while _inflight and _inflight[0].done() and _inflight[0].error is None:
        _inflight.popleft()  # finished cleanly: nothing to report
    _inflight.append(done)
    metrics.counter_inc("ExecuteComputation")
    if outs is None:
        return [Placeholder(done, None) for _ in range(n_outputs)]
    return [Placeholder(done, a) for a in outs]
