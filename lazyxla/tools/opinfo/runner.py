"""One OpInfo on its first samples, and a whole run: per OpInfo its status (``ok``, ``fallback``,
``wrong``, ``error``, ``refused`` or ``no-sample``; a wrong sample outranks an error, an error a
fallback; the first problem is kept), under a time limit; one op never stops the run.

Touches the lazy device's counters, compilation cache and seeds; the CPU RNG state is restored.
"""
from __future__ import annotations

import collections
import dataclasses
import gc
import itertools
import re
import signal
import threading
import time
import warnings

import torch

from ... import manual_seed, sync
from ...frontend.device import device
from .sample import RandomSample, Rejected, first_line, check_sample
from .select import full_name, parse_mode, select


STATUSES = ("ok", "fallback", "wrong", "error", "refused", "no-sample")

# What lazyxla refuses on purpose, with a LazyXlaError that says so: XLA has dense arrays only,
# so sparse layouts (COO, CSR, ...) are not kept on the device (torch_xla has none either).
REFUSED = re.compile(r"^LazyXlaError: .*does not support torch\.sparse_\w+ tensors")


@dataclasses.dataclass
class OpResult:
    name: str
    status: str  # one of STATUSES
    samples: int = 0  # samples eager accepted (compared or failed on the lazy device)
    counters: dict = dataclasses.field(default_factory=dict)  # aten::* counter -> times moved
    problem: str = ""  # the first problem, if any
    seconds: float = 0.0

    def record(self) -> dict:
        return dataclasses.asdict(self)


class _TimeLimit(BaseException):
    """The op ran past its time limit (a BaseException: the op's own handlers keep out)."""


# ---------------------------------------------------------------------------------------
# One OpInfo.
class _Alarm:
    """Raises _TimeLimit in the main thread after ``seconds`` (no-op elsewhere or if 0)."""

    def __init__(self, seconds):
        self.seconds = seconds if threading.current_thread() is threading.main_thread() else 0
        self.old = None

    def _fire(self, *_):
        raise _TimeLimit()

    def __enter__(self):
        if self.seconds and hasattr(signal, "setitimer"):
            self.old = signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.old)
        return False


def check_opinfo(opinfo, samples: int = 3, time_limit: float = 60.0, dtype=torch.float32, grad=False):
    """The ``OpResult`` of one OpInfo on its first ``samples`` samples of ``dtype`` that are not
    random (a sample that reaches a random op, such as attention with ``dropout_p > 0``, is
    passed over), or ``None`` if every sample was random. ``grad``: compare gradients."""
    name = full_name(opinfo)
    dev = device()
    t0 = time.monotonic()
    counters = collections.Counter()
    problems, wrong, rejected, accepted, random_samples = [], [], [], 0, 0
    try:
        with _Alarm(time_limit), torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            manual_seed(0)
            try:
                it = opinfo.sample_inputs("cpu", dtype, requires_grad=grad)
                batch = list(itertools.islice(it, 4 * samples))
            except Exception as e:
                return OpResult(name, "no-sample", problem="sample_inputs: " + first_line(e),
                                seconds=time.monotonic() - t0)
            for s in batch:
                if accepted + len(rejected) == samples:
                    break
                try:
                    r = check_sample(opinfo, s, dev, grad)
                except RandomSample:  # a random sample (dropout_p > 0): the next one instead
                    random_samples += 1
                    continue
                except Rejected as e:
                    rejected.append(str(e))
                    continue
                except Exception as e:  # a problem of the runner's own (never of the op)
                    r = {}, "runner: " + first_line(e)
                accepted += 1
                moved, problem = r
                counters.update(moved)
                if problem is not None:
                    (wrong if problem.startswith("wrong: ") else problems).append(problem)
    except _TimeLimit:
        problems.append(f"time limit: over {time_limit:g} s (after {accepted} samples)")
    finally:
        try:
            sync()  # no pending IR piles up from one op to the next
        except Exception:
            pass
        gc.collect()
    secs = time.monotonic() - t0
    counters = dict(sorted(counters.items()))
    if wrong:
        return OpResult(name, "wrong", accepted, counters, wrong[0][len("wrong: "):], secs)
    if problems:
        refused = all(REFUSED.match(p) for p in problems)
        return OpResult(name, "refused" if refused else "error", accepted, counters, problems[0], secs)
    if not accepted and random_samples and not rejected:
        return None
    if not accepted:
        why = f"eager rejects every sample ({rejected[0]})" if rejected else "no samples"
        return OpResult(name, "no-sample", 0, {}, why, secs)
    return OpResult(name, "fallback" if counters else "ok", accepted, counters, "", secs)


def run(names=None, samples: int = 3, time_limit: float = 60.0, progress=None, mode: str = "float32"):
    """``(results, excluded)``: an ``OpResult`` per OpInfo run, ``{name: reason}`` left out;
    ``mode``: a dtype's name, or ``float32-grad`` (``parse_mode``)."""
    dtype, grad = parse_mode(mode)
    opinfos, excluded = select(names, dtype, grad)
    results = []
    for i, o in enumerate(opinfos):
        if progress is not None:
            progress(i, len(opinfos), full_name(o))
        r = check_opinfo(o, samples, time_limit, dtype, grad)
        if r is None:
            excluded[full_name(o)] = "random (every sample reaches a nondeterministic_seeded ATen op)"
        else:
            results.append(r)
    return results, dict(sorted(excluded.items()))
