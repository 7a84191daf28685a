"""``torch_xla.amp`` under ``lazyxla run``: ``autocast(device, ...)`` is
``torch.autocast("lazyxla", ...)`` (bfloat16 by default, torch_xla's default on its devices);
``GradScaler`` is ``torch.amp.GradScaler("lazyxla")``. Touches nothing itself."""
from __future__ import annotations

import torch

from ... import not_offered


def autocast(device=None, enabled: bool = True, dtype=None, cache_enabled=None):
    """``torch.autocast("lazyxla", dtype=dtype or torch.bfloat16, enabled=enabled)``."""
    kwargs = {} if cache_enabled is None else {"cache_enabled": cache_enabled}
    return torch.autocast("lazyxla", dtype=dtype or torch.bfloat16, enabled=enabled, **kwargs)


def GradScaler(*args, **kwargs):  # noqa: N802 - torch_xla's name
    return torch.amp.GradScaler("lazyxla", *args, **kwargs)


__getattr__ = not_offered(__name__, {"syncfree": "torch.optim's optimizers (lazyxla records their steps)"})
