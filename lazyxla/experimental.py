"""``lazyxla.experimental``: eager mode (``eager_mode(True)``: each op runs at once; see ``lazyxla.engine.eager``).

``eager_mode(enable)`` switches it, ``is_eager_mode()`` says whether it is on (torch_xla's
``torch_xla.experimental.eager_mode`` and ``is_eager_mode``). May touch: eager mode's switch.
"""
from __future__ import annotations

from .engine import eager

__all__ = ["eager_mode", "is_eager_mode"]


def eager_mode(enable: bool) -> None:
    """Turn eager mode on (each op's outputs are computed when it is recorded, through the
    compilation cache of per-op programs) or off (operations pile up until a sync or a read)."""
    eager.set_eager(enable)


def is_eager_mode() -> bool:
    return eager.is_eager()
