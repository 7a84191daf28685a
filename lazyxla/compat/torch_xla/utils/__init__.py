"""``torch_xla.utils`` under ``lazyxla run``: holds ``utils`` (``xu``). Touches nothing."""
from . import utils  # noqa: F401
