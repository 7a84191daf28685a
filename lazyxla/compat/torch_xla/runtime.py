"""``torch_xla.runtime`` (``xr``) under ``lazyxla run``: ``lazyxla.runtime``'s names, plus the
device and process counts of a job of one-device processes (``lazyxla.distributed.world``).
Touches nothing itself."""
from __future__ import annotations

import jax

from lazyxla.runtime import (device_type, global_ordinal, global_runtime_device_count, initialize_cache,  # noqa: F401
                             is_spmd, local_ordinal, use_spmd, world_size)

from lazyxla.distributed import world as _world

from .. import not_offered


def addressable_device_count() -> int:
    """Devices this process addresses: one (lazyxla runs one device per process)."""
    return 1


def local_process_count() -> int:
    """The job's processes on this machine."""
    return _world.local_world_size()


def local_device_count() -> int:
    """Devices on this machine: one per process of the job that runs here."""
    return _world.local_world_size()


def global_device_count() -> int:
    return global_runtime_device_count()


def addressable_runtime_device_count() -> int:
    return jax.local_device_count()


def process_index() -> int:
    return global_ordinal()


def process_count() -> int:
    return world_size()


def host_index() -> int:
    """This machine's rank among the job's machines."""
    return _world.node_rank()


__getattr__ = not_offered(__name__, {
    "set_device_type": "JAX picks the platform (JAX_PLATFORMS); lazyxla.runtime.device_type() says which",
    "using_pjrt": "lazyxla always runs on JAX's PJRT runtime",
    "get_master_ip": "lazyxla.distributed.init() reads MASTER_ADDR",
})
