"""Running compiled programs, asynchronously (R4.4), and their failures.

JAX dispatches a program on the CPU asynchronously: the call returns its output arrays at
once and XLA's threads compute them, so tracing the next step overlaps this one. ``run``
calls a program and returns one ``Placeholder`` per output; one completion thread waits
on each program in order, to record ``ExecuteTime`` and to catch a failure, which
surfaces at the next ``wait_device_ops()`` or value read, naming the graph's hash. At most
``MAX_INFLIGHT`` programs are in flight (torch_xla's device lock allows one), so a runaway
queue cannot pin many steps' buffers.

May touch: the buffers it is given (donated ones are consumed by their program), its queue
of in-flight programs, the ``ExecuteTime`` metric and ``ExecuteComputation`` counter.
"""
from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait

from . import metrics

_now = metrics.now_ns
_waiter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lazyxla-exec")
MAX_INFLIGHT = 2
_inflight = deque()  # completion futures not yet waited on by wait_device_ops, oldest first
_last_done = 0  # when the previous program finished (ExecuteTime counts from then if later)


class ExecutionError(RuntimeError):
    """An XLA program failed; raised at the next wait or value read. ``root``: the first
    failure's own message, when this one only followed from it."""

    def __init__(self, message, root=None):
        super().__init__(message)
        self.root = root or message


# Set by lazyxla.distributed when this process is one of a job: says which processes are lost
# when a program fails (it may wait for the job's heartbeat timeout to know). None otherwise.
explain_failure = None


class Placeholder:
    """An output buffer of a dispatched program: the array (perhaps not computed yet) and
    the program's completion, which says whether it failed."""

    __slots__ = ("future", "array")

    def __init__(self, future, array):
        self.future = future
        self.array = array

    def get(self):
        """The computed array; waits for the program and raises if it failed."""
        err = self.future.exception()
        if err is not None:
            try:  # reported here: the next wait_device_ops() does not report it again
                _inflight.remove(self.future)
            except ValueError:
                pass
            # a fresh exception: re-raising the stored one would pin the caller's frames
            raise ExecutionError(str(err), getattr(err, "root", None)) from None
        return self.array


def resolve(d, wait=True):
    """The jax.Array behind a storage's data; raises if its program failed or its buffer was
    donated. ``wait=False`` (an input to the next program) does not wait for it to be computed:
    only a failure already known is raised."""
    if type(d) is Placeholder:
        if wait:
            d = d.get()
        else:
            f = d.future
            if f.done() and f.exception() is not None:
                raise ExecutionError(str(f.exception()), getattr(f.exception(), "root", None))
            d = d.array
    if d.is_deleted():
        raise ExecutionError("lazyxla: this device buffer was donated to a program "
                             "(lazyxla.set_buffer_donation) and no longer exists")
    return d


def _await(outs, key_hex, t0):
    for a in outs:
        try:
            a.block_until_ready()
        except Exception as e:  # noqa: BLE001 - surfaced at the next wait or read
            if a.is_deleted():
                continue  # donated to a later program, which waits on it (and fails if it failed)
            raise ExecutionError(_failure_text(key_hex, e)) from None
    global _last_done
    t1 = _now()
    metrics.metric_add("ExecuteTime", t1 - max(t0, _last_done), "time")
    _last_done = t1


def _failure_text(key_hex, e):
    text = f"lazyxla: execution of graph {key_hex} failed: {type(e).__name__}: {e}"
    if explain_failure is not None:
        text += explain_failure()
    return text


def _failed(message, root=None):
    f = Future()
    f.set_exception(ExecutionError(message, root))
    return f


def wait_device_ops():
    """Wait for every scheduled execution; raise the first failure since the last wait."""
    futures = list(_inflight)
    for _ in futures:
        _inflight.popleft()
    first = None
    for f in futures:
        e = f.exception()
        if e is not None and first is None:
            first = e
    if first is not None:
        raise ExecutionError(str(first)) from None


def run(executable, inputs, n_outputs: int, key_hex: str) -> list:
    """Call ``executable`` on the buffers ``inputs`` (storage data: arrays or Placeholders);
    returns one Placeholder per output, at once. A failure to dispatch surfaces at the next
    wait or read, as one while running does."""
    if len(_inflight) >= MAX_INFLIGHT:
        wait([_inflight[-MAX_INFLIGHT]])
    try:
        args = [resolve(d, wait=False) for d in inputs]
    except ExecutionError as e:  # named after the first failure, not after the chain that led here
        fut, outs = _failed(f"lazyxla: graph {key_hex} not run: an input comes from a failed graph ({e.root})",
                            e.root), None
    else:
        t0 = _now()
        try:
            outs = executable(*args)
        except Exception as e:  # noqa: BLE001 - surfaced at the next wait or read
            fut, outs = _failed(_failure_text(key_hex, e)), None
        else:
            fut = _waiter.submit(_await, outs, key_hex, t0)
    while _inflight and _inflight[0].done() and _inflight[0].exception() is None:
        _inflight.popleft()  # finished cleanly: nothing to report
    _inflight.append(fut)
    metrics.counter_inc("ExecuteComputation")
    if outs is None:
        return [Placeholder(fut, None) for _ in range(n_outputs)]
    return [Placeholder(fut, a) for a in outs]
