"""``torch_xla.distributed.xla_backend`` under ``lazyxla run``: importing it makes
``torch.distributed.init_process_group("xla", init_method="xla://")`` work, as the ``"lazyxla"``
backend (``lazyxla.distributed.c10d``): the ``"xla"`` backend name and the ``xla://`` rendezvous
(a world of one in a single process; torchrun's or ``launch``'s environment in a job).
May touch: torch.distributed's backend and rendezvous registries (once).
"""
from __future__ import annotations

from lazyxla.distributed import c10d as _c10d

from ... import not_offered

_c10d.register_alias("xla")

__getattr__ = not_offered(__name__, {"ProcessGroupXla": "torch.distributed.init_process_group('lazyxla')"})
