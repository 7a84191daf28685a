"""``torch_xla.experimental.scan`` under ``lazyxla run``: ``lazyxla.scan``. ``partition_fn`` and
``is_fn_pure`` are accepted: the backward is JAX's transpose of the loop (no partition to choose),
and the body is traced at every call (once per call, not per iteration). Touches nothing itself."""
from lazyxla.regions.scan import scan as _scan


def scan(fn, init, xs, partition_fn=None, is_fn_pure=False):
    return _scan(fn, init, xs)
