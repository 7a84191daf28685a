"""``torch_xla.distributed.xla_multiprocessing`` (``xmp``) under ``lazyxla run``: ``spawn`` is
``lazyxla.distributed.launch`` (``nprocs`` None or 1: ``fn(0, *args)`` in this process, as
torch_xla on a CPU runs one process; more: that many processes). Touches nothing itself."""
from __future__ import annotations

import lazyxla.distributed as _xd

from ... import not_offered


def spawn(fn, args=(), nprocs=None, join=True, daemon=False, start_method="spawn"):
    return _xd.launch(fn, args, nprocs=nprocs, start_method=start_method)


__getattr__ = not_offered(__name__, {"MpModelWrapper": "model.to(lazyxla.device()) in each process",
                                     "MpSerialExecutor": "lazyxla.distributed.rendezvous"})
