"""torch_xla.debug.metrics for lazyxla: `import lazyxla.debug.metrics as met`.

Thin re-exports of the arena in `lazyxla.metrics`, under torch_xla's names.
"""

from .. import metrics as _m

counter_names = _m.counter_names
counter_value = _m.counter_value
metric_names = _m.metric_names
metric_data = _m.metric_data
clear_counters = _m.clear_counters
clear_metrics = _m.clear_metrics
metrics_report = _m.metrics_report
short_metrics_report = _m.short_metrics_report
executed_fallback_ops = _m.executed_fallback_ops


def clear_all():
    """Clear all metrics and all counters."""
    clear_metrics()
    clear_counters()
