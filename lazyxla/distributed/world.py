"""Several processes, one job: starting JAX's distributed runtime and saying who is who.

``init()`` joins this process to a job: it reads torchrun's environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) or its arguments and starts
``jax.distributed`` (PJRT; collectives over gloo on the CPU). JAX's coordinator listens on
``MASTER_PORT + 1`` (torchrun's own store holds ``MASTER_PORT``) unless
``LAZYXLA_COORDINATOR_PORT`` says otherwise. ``spawn(fn, args, nprocs)`` starts ``nprocs``
real processes on this machine that each call ``init()`` then ``fn(index, *args)``
(torch_xla's ``xmp.spawn``). Once joined, every program lazyxla compiles runs on one device
per process (``process_mesh``), so the collectives recorded in a step (``collectives``) are
part of its one program; every process must run the same programs in the same order.

May touch: JAX's distributed runtime (started once), execution's failure explainer (which names
lost processes), the in-memory compilation cache
(emptied when the process joins: its programs were built for one process).
"""
from __future__ import annotations

import multiprocessing
import os
import socket

import jax
import numpy as np
import torch

from ..run import execution
from ..xla import jax_internals, client as xla
from ..config import env_int, env_str
from ..errors import LazyXlaError
from ..lowering import PROCESS_AXIS as AXIS  # the process axis that the collectives reduce over

_state = {"world": 1, "rank": 0, "local_rank": 0, "local_world": 1, "node": 0}  # the mesh: xla.process_mesh()


def world_size() -> int:
    """How many processes take part (1 before ``init``)."""
    return _state["world"]


def global_ordinal() -> int:
    """This process's rank among all processes."""
    return _state["rank"]


def local_ordinal() -> int:
    """This process's rank on its machine."""
    return _state["local_rank"]


def local_world_size() -> int:
    """How many of the job's processes run on this machine (torchrun's ``LOCAL_WORLD_SIZE``)."""
    return _state["local_world"]


def node_rank() -> int:
    """This machine's rank among the job's machines (torchrun's ``GROUP_RANK``)."""
    return _state["node"]


def process_mesh():
    """The 1-D JAX mesh of one device per process (each process's first), axis ``AXIS``;
    None in a single process."""
    return xla.process_mesh()


def _env_int(name, given, default=None):
    if given is not None:
        return int(given)
    if not env_str(name).strip():
        if default is None:
            raise LazyXlaError(f"lazyxla.distributed.init: {name} is not set; launch with torchrun (or "
                               f"lazyxla.distributed.spawn), or pass it to init()")
        return default
    try:
        return env_int(name, default)
    except ValueError as e:
        raise LazyXlaError(f"lazyxla.distributed.init: {e}") from None


def init(rank=None, world_size=None, master_addr=None, master_port=None, local_rank=None,
         timeout: int = 120, heartbeat_timeout: int | None = None) -> None:
    """Join this process to the job (once, before any tensor is on the device).

    ``timeout``: seconds to wait for every process to join; ``heartbeat_timeout`` (default
    ``LAZYXLA_HEARTBEAT_TIMEOUT`` or 30): seconds after which a process that stopped answering
    is declared lost and the others stop with an error naming it."""
    if _state["world"] > 1:
        raise LazyXlaError("lazyxla.distributed.init: this process has already joined a job")
    rank = _env_int("RANK", rank)
    world = _env_int("WORLD_SIZE", world_size)
    local = _env_int("LOCAL_RANK", local_rank, default=rank)
    if world < 1 or not 0 <= rank < world:
        raise LazyXlaError(f"lazyxla.distributed.init: rank {rank} is not within a world of {world} processes")
    local_world = _env_int("LOCAL_WORLD_SIZE", None, default=world)
    node = _env_int("GROUP_RANK", None, default=0)
    if world == 1:
        _state.update(world=1, rank=0, local_rank=local, local_world=1, node=0)
        return
    addr = master_addr or env_str("MASTER_ADDR") or "127.0.0.1"
    port = _env_int("LAZYXLA_COORDINATOR_PORT", None, default=0) or _env_int("MASTER_PORT", master_port) + 1
    beat = heartbeat_timeout or _env_int("LAZYXLA_HEARTBEAT_TIMEOUT", None, default=30)
    if rank == 0:
        _check_port_free(addr, port)
    if jax_internals.backend_started():
        raise LazyXlaError("lazyxla.distributed.init: call it before any tensor is on the device (JAX's runtime "
                           "already started for this process alone)")
    try:
        jax.distributed.initialize(coordinator_address=f"{addr}:{port}", num_processes=world, process_id=rank,
                                   initialization_timeout=int(timeout), heartbeat_timeout_seconds=int(beat))
    except Exception as e:  # noqa: BLE001 - JAX raises its runtime's own errors
        raise LazyXlaError(
            f"lazyxla.distributed.init: process {rank} of {world} could not join the job at {addr}:{port} within "
            f"{timeout} s ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). Every process must "
            f"be started with the same WORLD_SIZE and MASTER_ADDR/MASTER_PORT") from None
    _agree_on_world(rank, world, timeout)
    firsts = {}
    for d in jax.devices():  # by position, not id: ids are not contiguous across processes
        firsts.setdefault(d.process_index, d)
    mesh = jax.sharding.Mesh(np.array([firsts[p] for p in range(world)]), (AXIS,))
    _state.update(world=world, rank=rank, local_rank=local, local_world=local_world, node=node)
    xla.set_process_mesh(mesh)
    execution.explain_failure = _lost_processes
    from ..compiler.cache import computation_cache
    computation_cache().clear()


def launched() -> bool:
    """Whether a launcher (torchrun) started this process as one of several: ``RANK`` and a
    ``WORLD_SIZE`` above 1 in its environment."""
    return bool(env_str("RANK").strip()) and _env_int("WORLD_SIZE", None, default=1) > 1


def set_replication(device, devices=()) -> None:
    """torch_xla's ``xm.set_replication(device, devices)``: the devices this process's
    collectives replicate over. lazyxla's collectives always span the whole job, one device per
    process, so this checks that ``device`` (and each of ``devices``) is this process's device
    and, if a launcher started this process as one of several and it has not joined its job
    yet, joins it (``init()`` from the launcher's environment)."""
    from ..frontend.device import DEVICE
    for d in [device, *list(devices or ())]:
        dev = torch.device(d)
        if dev.type != DEVICE.type or (dev.index or 0) != 0:
            raise LazyXlaError(f"lazyxla.distributed.set_replication: {dev} is not this process's device "
                               f"{DEVICE} (lazyxla runs one device per process)")
    if _state["world"] == 1 and launched():
        init()


def _agree_on_world(rank, world, timeout):
    """Every process must have been started with the same world size: each says its own in
    the coordinator's key-value store and reads everyone's."""
    client = jax_internals.distributed_client()
    client.key_value_set(f"lazyxla/world_size/{rank}", str(world))
    if jax.process_count() != world:
        raise LazyXlaError(f"lazyxla.distributed.init: process {rank} was started with WORLD_SIZE={world}, but the "
                           f"job has {jax.process_count()} processes")
    for r in range(world):
        try:
            theirs = client.blocking_key_value_get(f"lazyxla/world_size/{r}", int(timeout * 1000))
        except Exception:  # noqa: BLE001
            raise LazyXlaError(f"lazyxla.distributed.init: process {r} did not say its world size within "
                               f"{timeout} s") from None
        if theirs != str(world):
            raise LazyXlaError(f"lazyxla.distributed.init: process {r} was started with WORLD_SIZE={theirs}, "
                               f"this process (rank {rank}) with {world}: every process must get the same")


def _lost_processes() -> str:
    """What a failed program says in a job: which processes stopped answering, as JAX's
    coordination service sees them (asking waits at most about the heartbeat timeout)."""
    world = _state["world"]
    try:
        live = jax_internals.distributed_client().get_live_nodes(list(range(world)))
    except Exception as e:  # noqa: BLE001 - the runtime may be going down itself
        return f" (in a job of {world} processes; which are alive could not be asked: {type(e).__name__})"
    lost = [r for r in range(world) if r not in live]
    if not lost:
        return f" (in a job of {world} processes, all still alive)"
    return (f" (in a job of {world} processes: process{'es' if len(lost) > 1 else ''} "
            f"{', '.join(map(str, lost))} stopped answering and {'are' if len(lost) > 1 else 'is'} lost)")


def _check_port_free(addr, port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1" if addr == "localhost" else addr, port))
        except OSError as e:
            raise LazyXlaError(f"lazyxla.distributed.init: the coordinator port {addr}:{port} is in use "
                               f"({e.strerror}); pick another MASTER_PORT (JAX's coordinator takes "
                               f"MASTER_PORT + 1) or set LAZYXLA_COORDINATOR_PORT") from None


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now (and the one above it)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s2:
                s2.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise LazyXlaError("lazyxla.distributed: found no free pair of ports on the loopback")


def _child(index, fn, args, env):
    os.environ.update(env)
    os.environ.update(RANK=str(index), LOCAL_RANK=str(index))
    init()
    fn(index, *args)


def spawn(fn, args=(), nprocs: int | None = None, join: bool = True, start_method: str = "spawn"):
    """Start ``nprocs`` processes (default: ``WORLD_SIZE`` or 2) that each join the job and
    call ``fn(index, *args)``, as torch_xla's ``xmp.spawn``. With ``join`` (default) wait for
    them and raise if one failed, naming it; otherwise return the processes."""
    n = int(nprocs or env_int("WORLD_SIZE", 2))
    env = {"WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    ctx = multiprocessing.get_context(start_method)
    procs = [ctx.Process(target=_child, args=(i, fn, tuple(args), env), daemon=False) for i in range(n)]
    for p in procs:
        p.start()
    if not join:
        return procs
    failed = []
    for i, p in enumerate(procs):
        p.join()
        if p.exitcode != 0:
            failed.append((i, p.exitcode))
    if failed:
        raise LazyXlaError("lazyxla.distributed.spawn: " + ", ".join(
            f"process {i} exited with code {c}" for i, c in failed))
    return None
