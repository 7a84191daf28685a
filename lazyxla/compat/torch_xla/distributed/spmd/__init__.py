"""``torch_xla.distributed.spmd`` (``xs``) under ``lazyxla run``: ``lazyxla.distributed.spmd``'s
names (``Mesh``, ``mark_sharding``, ``clear_sharding``, ``get_1d_mesh``, ``set_global_mesh``,
``get_global_mesh``, ``get_sharding_spec``, ``global_tensor``). Touches nothing itself."""
from lazyxla.distributed.spmd import *  # noqa: F401,F403
from lazyxla.distributed.spmd import __all__  # noqa: F401

from .... import not_offered

__getattr__ = not_offered(__name__, {
    "HybridMesh": "lazyxla.distributed.spmd.Mesh",
    "ShardingSpec": "lazyxla.distributed.spmd.mark_sharding",
    "SpmdFullyShardedDataParallel": "lazyxla.distributed.spmd.mark_sharding on the parameters",
    "enable_manual_sharding": "lazyxla.distributed.spmd.mark_sharding",
    "disable_manual_sharding": "lazyxla.distributed.spmd.clear_sharding",
})
