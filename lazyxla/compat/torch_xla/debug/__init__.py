"""``torch_xla.debug`` under ``lazyxla run``: holds ``metrics`` (``met``) and ``profiler`` (``xp``).
Touches nothing."""
from . import metrics, profiler  # noqa: F401
from ... import not_offered

__getattr__ = not_offered(__name__)
