"""``torch_xla.debug.metrics`` (``met``) under ``lazyxla run``: ``lazyxla.debug.metrics``.
Touches nothing itself."""
from lazyxla.debug.metrics import (clear_all, clear_counters, clear_metrics, counter_names,  # noqa: F401
                                   counter_value, executed_fallback_ops, metric_data, metric_names,
                                   metrics_report, short_metrics_report)

from ... import not_offered

__getattr__ = not_offered(__name__)
