"""``torch_xla.backends`` under ``lazyxla run``: ``lazyxla.backends`` (``set_mat_mul_precision``,
``get_mat_mul_precision``). Touches nothing itself."""
from lazyxla.backends import get_mat_mul_precision, set_mat_mul_precision  # noqa: F401

from .. import not_offered

__getattr__ = not_offered(__name__)
