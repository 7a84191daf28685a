"""``torch_xla.core.xla_model`` (``xm``) under ``lazyxla run``: forwarded to lazyxla's API.

Steps: ``mark_step`` -> ``lazyxla.sync``, ``wait_device_ops``, ``add_step_closure``
(``lazyxla.add_step_closure``). Reporting: ``RateTracker``, ``master_print``, ``is_master_ordinal``
(``lazyxla.progress``). Processes: ``set_replication``, ``optimizer_step``, ``reduce_gradients``,
``_fetch_gradients``, ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``collective_broadcast``,
``rendezvous`` (``lazyxla.distributed``), ``mesh_reduce``, ``broadcast_master_param``. Data:
``send_cpu_data_to_device`` (``lazyxla.data.send_to_device``), ``save`` and ``_maybe_convert_to_cpu``
(``lazyxla.distributed.host_copy``). Touches nothing itself.
"""
from __future__ import annotations

import sys

import torch

import lazyxla
import lazyxla.distributed as _xd
from lazyxla import progress as _progress
from lazyxla.data import send_to_device as _send_to_device
from lazyxla.ir import rng as _rng
from lazyxla.distributed import world as _world
from lazyxla.runtime import device_type as _device_type

from ... import not_offered

REDUCE_SUM, REDUCE_MAX, REDUCE_MIN = _xd.REDUCE_SUM, _xd.REDUCE_MAX, _xd.REDUCE_MIN
RateTracker = _progress.RateTracker


def xla_device(n=None, devkind=None):
    return lazyxla.device(0 if n is None else n)


def get_xla_supported_devices(devkind=None, max_devices=None):
    return [str(lazyxla.device())]


def xla_device_hw(device) -> str:
    return _device_type()


def is_xla_tensor(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type == lazyxla.device().type


def get_local_ordinal() -> int:
    return _world.local_ordinal()


def get_ordinal() -> int:
    return _world.global_ordinal()


def xrt_world_size() -> int:
    return _world.world_size()


def is_master_ordinal(local: bool = True) -> bool:
    return _progress.is_master(local=local)


def master_print(*args, fd=sys.stdout, local: bool = False, flush: bool = False) -> None:
    _progress.master_print(*args, fd=fd, local=local, flush=flush)


def mark_step(wait: bool = False, reset_scope: bool = True) -> None:
    lazyxla.sync(wait=wait)


def wait_device_ops(devices=()) -> None:
    lazyxla.wait_device_ops()


def add_step_closure(closure, args=(), run_async: bool = False) -> None:
    lazyxla.add_step_closure(closure, args, run_async=run_async)


def optimizer_step(optimizer, barrier=False, optimizer_args={}, groups=None, pin_layout=True):  # noqa: B006
    return _xd.optimizer_step(optimizer, barrier=barrier, optimizer_args=optimizer_args, groups=groups,
                              pin_layout=pin_layout)


def reduce_gradients(optimizer, groups=None, pin_layout=True) -> None:
    _xd.reduce_gradients(optimizer, groups=groups, pin_layout=pin_layout)


def all_reduce(reduce_type, inputs, scale=1.0, groups=None, pin_layout=True):
    return _xd.all_reduce(reduce_type, inputs, scale=scale, groups=groups, pin_layout=pin_layout)


def all_gather(value, dim=0, groups=None, output=None, pin_layout=True):
    return _xd.all_gather(value, dim=dim, groups=groups, output=output, pin_layout=pin_layout)


def reduce_scatter(reduce_type, input, scale, scatter_dim, shard_count, groups=None, output=None,
                   pin_layout=True):
    return _xd.reduce_scatter(reduce_type, input, scale, scatter_dim, shard_count, groups=groups, output=output,
                              pin_layout=pin_layout)


def rendezvous(tag, payload=b"", replicas=[]):  # noqa: B006
    return _xd.rendezvous(tag, payload, replicas)


def mesh_reduce(tag, data, reduce_fn):
    return _xd.mesh_reduce(tag, data, reduce_fn)


def broadcast_master_param(model) -> None:
    _xd.broadcast_params(model)


def set_replication(device, devices) -> None:
    _xd.set_replication(device, devices)


def send_cpu_data_to_device(datas, device, input_sharding=None):
    """``lazyxla.data.send_to_device``; a lone tensor comes back in a list, as torch_xla's does."""
    if input_sharding is not None:
        raise NotImplementedError("torch_xla.core.xla_model.send_cpu_data_to_device(input_sharding=...) is not "
                                  "offered by lazyxla (nearest lazyxla alternative: "
                                  "lazyxla.distributed.spmd.mark_sharding on the uploaded tensors)")
    return _send_to_device([datas] if isinstance(datas, torch.Tensor) else datas, device)


def _fetch_gradients(optimizer):
    return _xd.gradients(optimizer)


def _maybe_convert_to_cpu(data, convert=True):
    return _xd.host_copy(data) if convert else data


def collective_broadcast(tensors, root_ordinal=0, groups=None, pin_layout=True):
    if groups:
        raise NotImplementedError("torch_xla.core.xla_model.collective_broadcast(groups=...) is not offered by "
                                  "lazyxla (its collectives span every process)")
    _xd.broadcast_(tensors, root_ordinal)


def set_rng_state(seed, device=None) -> None:
    lazyxla.manual_seed(seed)


def get_rng_state(device=None) -> int:
    return int.from_bytes(bytes(_rng.get_state().tolist()), "little")


def save(data, file_or_path, master_only=True, global_master=False) -> None:
    """Move the lazy tensors in ``data`` to the CPU and ``torch.save`` them (on the master only)."""
    host = _xd.host_copy(data)
    if not master_only or _progress.is_master(local=not global_master):
        torch.save(host, file_or_path)
    _xd.rendezvous("torch_xla.core.xla_model.save")


__getattr__ = not_offered(__name__, {
    "get_memory_info": "none (JAX's device memory stats: jax.devices()[0].memory_stats())",
    "optimization_barrier_": "none: lazyxla.sync() ends a program",
    "all_to_all": "lazyxla.distributed.all_gather / reduce_scatter",
    "collective_permute": "lazyxla.distributed.broadcast",
    "send": "lazyxla.distributed.broadcast", "recv": "lazyxla.distributed.broadcast",
    "get_stablehlo": "lazyxla.dump_hlo(tensors) (HLO text)",
    "get_stablehlo_bytecode": "lazyxla.dump_hlo(tensors) (HLO text)",
    "unlazy": "lazyxla.sync()",
    "xla_replication_devices": "lazyxla.distributed.init()",
    "all_reduce_bucketized_gradients": "lazyxla.distributed.optimizer_step(opt)",
    "all_gather_bucketized": "lazyxla.distributed.all_gather",
    "reduce_scatter_bucketized": "lazyxla.distributed.reduce_scatter",
    "fork_rng": "lazyxla.manual_seed(seed)",
    "do_on_ordinals": "lazyxla.progress.is_master()",
    "xla_real_devices": "lazyxla.runtime.device_type()",
    "xla_device_kind": "lazyxla.runtime.device_type()",
    "ToXlaTensorArena": "lazyxla.data.DeviceLoader",
})
