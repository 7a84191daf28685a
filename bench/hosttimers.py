"""Timers around lazyxla's parts of a step, for ``hostcost.py``'s "where the time goes".

``install()`` wraps, for the time of a ``with`` block, the places where a step's host time
enters lazyxla: a compiled region's call (``capture.Region.__call__``), an op recorded one by
one (``LazyTensor.__torch_dispatch__``; only the outermost of nested calls counts) and, inside
a sync, JAX's call of the program (``executor.run``: the call and its output placeholders).
The step's caller times ``lazyxla.sync()`` itself. Dynamo is told to leave this module alone
(its frames run inside compiled functions), as it leaves lazyxla's.
"""
from __future__ import annotations

import contextlib
import time

_now = time.perf_counter
SPENT = {"regions": 0.0, "ops": 0.0, "dispatch": 0.0}
_depth = [0]


@contextlib.contextmanager
def install():
    from torch._dynamo import trace_rules

    from lazyxla.regions import region as capture
    from lazyxla.engine import executor
    from lazyxla.frontend.tensor import LazyTensor
    trace_rules.add(__name__)
    region_call, dispatch, run = capture.Region.__call__, LazyTensor.__torch_dispatch__.__func__, executor.run

    def timed_region(self, *args):
        t = _now()
        try:
            return region_call(self, *args)
        finally:
            SPENT["regions"] += _now() - t

    def timed_dispatch(cls, func, types, args=(), kwargs=None):
        if _depth[0]:
            return dispatch(cls, func, types, args, kwargs)
        _depth[0] += 1
        t = _now()
        try:
            return dispatch(cls, func, types, args, kwargs)
        finally:
            SPENT["ops"] += _now() - t
            _depth[0] -= 1

    def timed_run(*args, **kwargs):
        t = _now()
        try:
            return run(*args, **kwargs)
        finally:
            SPENT["dispatch"] += _now() - t

    capture.Region.__call__ = timed_region
    LazyTensor.__torch_dispatch__ = classmethod(timed_dispatch)
    executor.run = timed_run
    try:
        yield SPENT
    finally:
        capture.Region.__call__ = region_call
        LazyTensor.__torch_dispatch__ = classmethod(dispatch)
        executor.run = run


def reset():
    for k in SPENT:
        SPENT[k] = 0.0

