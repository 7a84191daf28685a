"""torch_xla's ``torch_xla.runtime`` (``xr``) for lazyxla: ``import lazyxla.runtime as xr``.

``initialize_cache(path, readonly=False)`` turns on the persistent compilation cache (R7), as
``XLA_PERSISTENT_CACHE_PATH`` does. ``global_runtime_device_count()`` is the number of devices
(``CPU_NUM_DEVICES`` on the CPU); ``use_spmd()`` turns SPMD on (R12): ``lazyxla.device()`` then
stands for every device, and data moved there is replicated until annotated
(``lazyxla.distributed.spmd``). ``world_size()``, ``global_ordinal()`` and ``local_ordinal()``
say who this process is in a job of several (``lazyxla.distributed.init``). ``device_type()``
is the kind of device the programs run on, in torch_xla's words (``"CPU"``, ``"CUDA"``, ``"TPU"``),
from JAX's platform. Touches the SPMD switch only.
"""
from __future__ import annotations

import jax

from .ir import rng
from .run import storage
from .xla import client as xla
from .distributed import world as _world
from .errors import LazyXlaError
from .compiler.persistent_cache import initialize_cache

__all__ = ["initialize_cache", "global_runtime_device_count", "use_spmd", "is_spmd", "world_size",
           "global_ordinal", "local_ordinal", "device_type"]


def global_runtime_device_count() -> int:
    """How many devices the runtime has (all processes)."""
    return jax.device_count()


def use_spmd(auto: bool = False) -> None:
    """Turn SPMD on, before any tensor is on the device (as torch_xla asks). ``auto=True`` sets
    the auto-sharding flag: the graph hash folds it with ``XLA_AUTO_SPMD_MESH`` and donation is
    off (R3.6, R9.2), but JAX 0.10 has no working auto-partitioner, so the first compile raises."""
    if xla.spmd():
        xla.set_spmd(True, auto or xla.auto_sharding())
        return
    if any(s.storage.data is not None for s in storage.live_states()):
        raise LazyXlaError("lazyxla: use_spmd() must be called before any tensor is moved to or created on the "
                           "device (their buffers live on one device)")
    xla.set_spmd(True, auto)
    storage.forget_scalars()  # cached scalar buffers were placed on one device
    rng.set_current(None)     # so was the seed's


def is_spmd() -> bool:
    return xla.spmd()


# who this process is in a job of several (lazyxla.distributed.init); a world of one before
world_size = _world.world_size
global_ordinal = _world.global_ordinal
local_ordinal = _world.local_ordinal

# JAX's platform names -> torch_xla's device types (xr.device_type())
_DEVICE_TYPES = {"cpu": "CPU", "gpu": "CUDA", "cuda": "CUDA", "rocm": "ROCM", "tpu": "TPU"}


def device_type() -> str:
    """The kind of device lazyxla's programs run on: ``"CPU"`` on JAX's CPU backend, ``"CUDA"`` on
    an NVIDIA GPU, ``"TPU"``, ``"ROCM"`` (torch_xla's ``xr.device_type()``)."""
    platform = xla.jax_device().platform.lower()
    return _DEVICE_TYPES.get(platform, platform.upper())
