"""torch_xla's ``torch_xla.distributed`` for lazyxla: ``spmd`` (sharding over a device mesh),
``world`` (a job of several processes on JAX's distributed runtime: ``init``, ``spawn``) and
``collectives`` (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``, ``broadcast_``,
``optimizer_step``, ``gradients``, ``rendezvous``, recorded in the lazy graph); ``host`` (``launch``,
``mesh_reduce``, ``broadcast_params``, ``host_copy``: work between processes on the host);
``set_replication`` (torch_xla's: checks the device, joins a launched job). Touches nothing itself.

Beside ``hf``, on top of capture and replay. May import: ``frontend`` (lazy tensors, the
parameters' names), ``engine``, ``compiler``, ``run``, ``lowering`` (the collectives'
lowerings), ``ir``, ``xla`` and the shared modules.
"""
from .world import init, set_replication, spawn  # noqa: F401
from .collectives import (REDUCE_MAX, REDUCE_MIN, REDUCE_SUM, all_gather, all_reduce, broadcast,  # noqa: F401
                          broadcast_, gradients, optimizer_step, reduce_gradients, reduce_scatter, rendezvous)
from .host import broadcast_params, host_copy, launch, mesh_reduce  # noqa: F401
