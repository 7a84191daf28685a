"""``torch_xla.core`` under ``lazyxla run``: holds ``xla_model``. Touches nothing."""
from . import xla_model  # noqa: F401
