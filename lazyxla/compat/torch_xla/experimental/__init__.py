"""``torch_xla.experimental`` under ``lazyxla run``: eager mode (``lazyxla.experimental``).
Touches nothing itself."""
from lazyxla.experimental import eager_mode, is_eager_mode  # noqa: F401

from ... import not_offered

__getattr__ = not_offered(__name__, {"pallas_kernels": "none"})
