"""Host-side work across a job's processes: ``launch`` (start the job, or run in this process),
``mesh_reduce`` (reduce Python data from every process), ``broadcast_params`` (rank 0's
parameters everywhere).

``launch(fn, args=(), nprocs=None, start_method="spawn")`` is torch_xla's ``torch_xla.launch``
and ``xmp.spawn``: under torchrun (``RANK`` and ``WORLD_SIZE`` set) it joins the job
(``world.init``) and calls ``fn(local_rank, *args)``; with ``nprocs`` None or 1 it calls
``fn(0, *args)`` here, a world of one (torch_xla on a CPU also runs one process); with
``nprocs`` > 1 it starts that many processes (``world.spawn``, where torch_xla refuses).
``mesh_reduce(tag, data, reduce_fn)`` gives ``reduce_fn([data of rank 0, rank 1, ...])`` in
every process, with lazy tensors in ``data`` read to the host first (torch_xla's
``xm.mesh_reduce``); between processes the data travels through JAX's coordination service.

May touch: JAX's distributed runtime (its key-value store), the given model's tensors, sys
processes it starts.
"""
from __future__ import annotations

import base64
import io
import itertools

import torch
from torch.utils._pytree import tree_map

from ..xla import jax_internals
from ..config import env_str
from ..engine.executor import sync
from . import world
from .collectives import broadcast, copy_into

_ROUNDS = itertools.count()


def _torchrun() -> bool:
    return bool(env_str("RANK").strip()) and bool(env_str("WORLD_SIZE").strip())


def launch(fn, args=(), nprocs=None, start_method: str = "spawn"):
    """Run ``fn(index, *args)`` in each process of the job; see the module docstring."""
    args = tuple(args)
    if world.world_size() > 1:
        return fn(world.local_ordinal(), *args)
    if _torchrun():
        world.init()
        return fn(world.local_ordinal(), *args)
    if nprocs is None or int(nprocs) == 1:
        return fn(0, *args)
    return world.spawn(fn, args=args, nprocs=int(nprocs), start_method=start_method)


def host_copy(x):
    """``x`` with every tensor on the device read to the CPU (containers kept, as torch's pytree
    sees them). Aliases of one value (a tied weight under its two names in a state dict: one
    storage, the same view) become one CPU tensor, as they share storage in eager's state dict:
    ``torch.save`` keeps the tie and safetensors' savers keep one name, as they do for eager's
    (a copy each had HF's loaders find both names and refuse the tied one)."""
    memo = {}

    def host(t):
        if not isinstance(t, torch.Tensor) or t.device.type == "cpu":
            return t
        s = getattr(t, "_state", None)
        if s is None:
            return t.cpu()
        k = (id(s.storage), id(s.chain), tuple(t.shape), t.stride(), t.dtype)
        got = memo.get(k)
        if got is None:
            got = memo[k] = (t.cpu(), s)  # (the state kept alive: its ids stay its own)
        return got[0]
    return tree_map(host, x)


def mesh_reduce(tag: str, data, reduce_fn, timeout: int = 300):
    """``reduce_fn`` of the list of every process's ``data`` (rank order), in every process."""
    data = host_copy(data)
    n = world.world_size()
    if n == 1:
        return reduce_fn([data])
    client = jax_internals.distributed_client()
    key = f"lazyxla/mesh_reduce/{next(_ROUNDS)}/{tag}"
    buf = io.BytesIO()
    torch.save(data, buf)
    client.key_value_set(f"{key}/{world.global_ordinal()}", base64.b64encode(buf.getvalue()).decode("ascii"))
    parts = []
    for r in range(n):
        text = client.blocking_key_value_get(f"{key}/{r}", int(timeout * 1000))
        # the job's own processes wrote these (torch_xla exchanges torch.save bytes the same way)
        parts.append(torch.load(io.BytesIO(base64.b64decode(text)), weights_only=False))
    return reduce_fn(parts)


def broadcast_params(model: torch.nn.Module) -> None:
    """Give every process rank 0's parameters and buffers, then sync (torch_xla's
    ``xm.broadcast_master_param``). In a world of one only the sync."""
    if world.world_size() > 1:
        for t in list(model.parameters()) + list(model.buffers()):
            copy_into(t.data, broadcast(t.data, 0))
    sync()
