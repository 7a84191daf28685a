"""``torch_xla.test`` under ``lazyxla run``: holds ``test_utils``. Touches nothing."""
from . import test_utils  # noqa: F401
