"""``torch_xla.debug`` under ``lazyxla run``: holds ``metrics`` (``met``). Touches nothing."""
from . import metrics  # noqa: F401
from ... import not_offered

__getattr__ = not_offered(__name__, {"profiler": "PT_XLA_DEBUG_LEVEL=1 and lazyxla.debug.metrics"})
