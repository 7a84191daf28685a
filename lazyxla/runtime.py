"""torch_xla's ``torch_xla.runtime`` (``xr``) for lazyxla: ``import lazyxla.runtime as xr``.

``initialize_cache(path, readonly=False)`` turns on the persistent compilation cache (R7), as
``XLA_PERSISTENT_CACHE_PATH`` does. Touches nothing itself.
"""
from __future__ import annotations

from .persistent_cache import initialize_cache

__all__ = ["initialize_cache"]
