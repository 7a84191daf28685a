"""``torch_xla.debug.profiler`` (``xp``) under ``lazyxla run``: ``lazyxla.debug.profiler``
(``start_trace``, ``stop_trace``, ``Trace``, ``StepTrace``, ``start_server``); ``lazyxla profile
LOG_DIR`` reads the trace. Touches nothing itself."""
from lazyxla.debug.profiler import StepTrace, Trace, start_server, start_trace, stop_trace  # noqa: F401

from ... import not_offered

__getattr__ = not_offered(__name__, {"trace": "lazyxla.debug.profiler.start_trace / stop_trace",
                                     "trace_detached": "lazyxla.debug.profiler.start_trace / stop_trace"})
