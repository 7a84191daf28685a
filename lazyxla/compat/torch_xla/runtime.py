"""``torch_xla.runtime`` (``xr``) under ``lazyxla run``: ``lazyxla.runtime``'s names, plus the
device counts of a single-device process. Touches nothing itself."""
from __future__ import annotations

import jax

from lazyxla.runtime import (device_type, global_ordinal, global_runtime_device_count, initialize_cache,  # noqa: F401
                             is_spmd, local_ordinal, use_spmd, world_size)

from .. import not_offered


def addressable_device_count() -> int:
    return 1


def local_device_count() -> int:
    return 1


def global_device_count() -> int:
    return global_runtime_device_count()


def addressable_runtime_device_count() -> int:
    return jax.local_device_count()


def local_process_count() -> int:
    return 1


def process_index() -> int:
    return global_ordinal()


def process_count() -> int:
    return world_size()


def host_index() -> int:
    return 0


__getattr__ = not_offered(__name__, {
    "set_device_type": "JAX picks the platform (JAX_PLATFORMS); lazyxla.runtime.device_type() says which",
    "using_pjrt": "lazyxla always runs on JAX's PJRT runtime",
    "get_master_ip": "lazyxla.distributed.init() reads MASTER_ADDR",
})
