"""Debugging tools: metrics (``lazyxla.debug.metrics``) and the graph-hash fold trace.

``last_fold()`` returns the ``FoldTrace`` of the most recent compilation-cache lookup: the
six merges of R3 in order, each with its site, a readable summary of the ingredient, the
ingredient's 128-bit hash and the digest after the merge. ``print(last_fold())`` shows it.
``compiled_folds()`` returns the traces of every program in the in-memory cache.
Reads executor state only.
"""


def recompile_log():
    """One record per uncached compile, in order: ``.site`` (the first merge of R3 that
    differs from the closest earlier key, None for the first compile), ``.text``,
    ``.hash``, ``.closest``, ``.compile_ms``, ``.where`` (file, line, function)."""
    from .. import explain
    return explain.recompile_log()


def last_fold():
    """The fold trace (``graph_hash.FoldTrace``) of the latest cache lookup, or None."""
    from .. import executor
    return executor.LAST_TRACE


def compiled_folds():
    """Fold traces of the programs in the in-memory compilation cache, oldest first."""
    from ..cache import computation_cache
    return [p.trace for p in computation_cache().values()]
