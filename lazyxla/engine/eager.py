"""Eager mode's switch: when ``ON``, every op's outputs are computed as soon as it is recorded.

``tensor.dispatch`` calls ``after_op(out)`` after every op while ``ON`` is true (one global
check per op when off). ``lazyxla.experimental.eager_mode(True)`` turns it on.

What an op does in eager mode (torch_xla's eager mode does the same): the pending IR (the op's
outputs: everything before them was computed already) runs at once as one program, found in
the ordinary compilation cache by its graph hash (a repeated op with the same shapes compiles
nothing: ``CachedCompile``), and the outputs become device data, so printing or debugging
code sees values at once without a further program. It is not a step: ``MarkStep`` is not
counted and step closures do not run (they run at ``lazyxla.sync()``, which still ends a step
in eager mode). Each op that ran a program moves the RNG seed on, so two ``torch.randn`` calls
differ and use the same program, and ``manual_seed`` then the same op gives the same numbers.
Metrics, as torch_xla's: ``EagerOpCompileTime`` (one sample per op that compiled) and
``EagerOpExecuteTime`` (one per op that ran a program). ``lazyxla.compile`` turns eager mode
off for its step and back on after it.

May touch: the executor (it runs each op's program), the RNG seed, its metrics.
"""
from __future__ import annotations

from . import executor
from .. import metrics
from ..ir import rng

ON = False


def after_op(out):
    """Compute ``out`` (the op's result as PyTorch gets it; unused: every pending tensor is it) now."""
    t0 = metrics.now_ns()
    compiled_before = metrics.COUNTERS.get("UncachedCompile", 0)
    prog = executor.run_pending()
    if prog is None:
        return
    t1 = metrics.now_ns()
    if metrics.COUNTERS.get("UncachedCompile", 0) != compiled_before:
        metrics.metric_add("EagerOpCompileTime", prog.compile_ns or (t1 - t0), "time")
    metrics.metric_add("EagerOpExecuteTime", t1 - t0, "time")
    rng.mark_step()  # the next random op draws from a new seed, through the same program


def set_eager(enable: bool) -> None:
    global ON
    ON = bool(enable)


def is_eager() -> bool:
    return ON
