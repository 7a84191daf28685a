"""Diagnostics: metrics (``lazyxla.debug.metrics``), the graph-hash folds, recompile explanations.

``last_fold()`` returns the ``FoldTrace`` of the most recent compilation-cache lookup: the
six merges of R3 in order, each with its site, a readable summary of the ingredient, the
ingredient's 128-bit hash and the digest after the merge. ``print(last_fold())`` shows it.
``compiled_folds()`` returns the traces of every program in the in-memory cache;
``recompile_log()`` explains every uncached compile (``explain``). ``fold_page`` writes the
page that folds them term by term; ``walk`` and ``walk_page`` walk one sync of a run through the
executor's code with its values (``lazyxla explain --walk``); ``report`` is torch_xla's
``PT_XLA_DEBUG_LEVEL`` output; ``profiler`` is torch_xla's ``torch_xla.debug.profiler`` on JAX's
profiler, and ``profile`` reads what it writes (``lazyxla profile``).

``install()`` subscribes the diagnostics to the executor's events, once; ``import lazyxla``
calls it, so everything here works after ``import lazyxla`` alone.
May touch: its subscribers' state; reads the compilation cache.

Diagnostics listen to the engine (``events``) and read its caches: they sit above the engine
and below the front end. May import: ``engine``, ``keys``, ``dynamic``, ``compiler``,
``rolling``, ``run``, ``ir``, ``xla`` and the shared modules.
"""
from __future__ import annotations

from .. import events
from ..compiler.cache import computation_cache
from . import explain, metrics, profiler, report  # noqa: F401  (lazyxla.debug.metrics, .profiler)


class _LastFold:
    """Keeps the fold trace of the latest lookup."""

    trace = None

    def after_lookup(self, cause, trace, prog, graph, compiled):
        self.trace = trace


_LAST = _LastFold()
_RECORDER = explain.Recorder()
_REPORTER = report.Reporter()


def install() -> None:
    """Subscribe the diagnostics (once): the last fold, recompile explanations, and the
    ``PT_XLA_DEBUG_LEVEL`` report when its level is above 0."""
    events.subscribe(_LAST)
    events.subscribe(_RECORDER)
    if report.LEVEL > 0:
        events.subscribe(_REPORTER)


def recompile_log():
    """One record per uncached compile, in order: ``.site`` (the first merge of R3 that
    differs from the closest earlier key, None for the first compile), ``.text``,
    ``.hash``, ``.closest``, ``.compile_ms``, ``.where`` (file, line, function)."""
    return explain.recompile_log()


def last_fold():
    """The fold trace (``graph_hash.FoldTrace``) of the latest cache lookup, or None."""
    return _LAST.trace


def compiled_folds():
    """Fold traces of the programs in the in-memory compilation cache, oldest first."""
    return [p.trace for p in computation_cache().values()]
