"""Small helpers the tests share: counter and metric readings that treat absent as 0."""
import lazyxla.debug.metrics as met


def cnt(name) -> int:
    """A counter's value, 0 when it was never incremented."""
    return met.counter_value(name) or 0


def samples(name) -> int:
    """How many samples a metric has, 0 when it has none."""
    d = met.metric_data(name)
    return d[0] if d else 0
