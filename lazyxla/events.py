"""Who hears about lookups, compiles and steps: the executor publishes, diagnostics subscribe.

A subscriber is any object with some of these methods (each optional):

- ``before_compile(cause, trace, graph)``: a key missed every cache and is about to compile;
- ``after_lookup(cause, trace, program, graph, compiled)``: a lookup found or compiled
  ``program`` (a ``cache.CachedProgram``) for ``trace`` (the lookup's ``graph_hash.FoldTrace``);
- ``after_run(program, graph, outputs)``: ``program`` was dispatched on ``graph``'s parameters;
  ``outputs``: its output buffers (``execution.Placeholder``), one per root of ``graph``;
- ``after_step()``: a sync finished (``MarkStep`` counted);
- ``after_capture(region, why, key_hex, where, n_ops)``: a torch.compile region was traced and
  captured (``capture``): ``why`` says what made this trace happen (Dynamo's guard failures
  for a Dynamo recompile, new input shapes, or its first call).
- ``dynamic(kind, *info)``: a dimension became dynamic (``"dimension"``, its label, size,
  bound), a bound grew (``"bound"``, label, size, new bound, old bound), or a structure fell
  back to exact shapes (``"fallback"``, a ``dynamic.structure.Refusal``).
- ``after_graph_capture(step, why, key_hex, where)``: ``lazyxla.compile(step, replay=True)``
  captured its step (``replay``): ``why`` is "first capture", or what made it capture again.

``cause`` is ``"sync"`` or ``"read"``. Subscribers are added explicitly (``subscribe``), in one
place: ``lazyxla.debug.install()``, which ``import lazyxla`` calls; the code walk
(``lazyxla.debug.walk``) subscribes while it records and ``unsubscribe``s after. May touch: its
own lists.
"""
from __future__ import annotations

BEFORE_COMPILE: list = []
AFTER_LOOKUP: list = []
AFTER_RUN: list = []
AFTER_STEP: list = []
AFTER_CAPTURE: list = []
AFTER_GRAPH_CAPTURE: list = []
DYNAMIC: list = []


def _lists():
    return (("before_compile", BEFORE_COMPILE), ("after_lookup", AFTER_LOOKUP), ("after_run", AFTER_RUN),
            ("after_step", AFTER_STEP), ("after_capture", AFTER_CAPTURE),
            ("after_graph_capture", AFTER_GRAPH_CAPTURE), ("dynamic", DYNAMIC))


def subscribe(subscriber) -> None:
    """Add ``subscriber``'s methods to the lists of those it has (once)."""
    for name, hooks in _lists():
        fn = getattr(subscriber, name, None)
        if fn is not None and fn not in hooks:
            hooks.append(fn)


def unsubscribe(subscriber) -> None:
    """Take ``subscriber``'s methods off every list."""
    for name, hooks in _lists():
        fn = getattr(subscriber, name, None)
        if fn is not None and fn in hooks:
            hooks.remove(fn)

