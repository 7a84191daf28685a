"""``torch.distributed`` on lazy tensors: the process-group backend ``"lazyxla"`` and the
c10d collectives recorded in the lazy graph.

``torch.distributed.init_process_group("lazyxla")`` joins the job (``world.init``, from
torchrun's environment) and gives PyTorch a gloo group for what it does on the CPU (``barrier``,
its own bookkeeping). A collective called on lazy tensors (``dist.all_reduce``, ``all_gather``,
``all_gather_into_tensor``, ``broadcast``, ``reduce_scatter``, ``reduce_scatter_tensor``, and
DistributedDataParallel's gradient buckets) reaches lazyxla as a ``c10d::`` op: it is recorded
as the matching ``collectives`` node and written into the tensors PyTorch gave, and PyTorch
gets a finished ``Work`` (the values come with the step's program). Only a group of every
process is supported.

``register()`` (called by ``import lazyxla``) adds the handlers to ``ops.SPECIAL`` and the
backend to ``torch.distributed``. May touch: those two registries, the tensors given.
"""
from __future__ import annotations

import torch

from ..errors import LazyXlaError
from ..ir.user_line import fmt_where, user_frame
from . import collectives as coll
from . import world

# c10d's RedOpType numbers (torch.distributed.ReduceOp)
_SUM, _AVG, _PRODUCT, _MIN, _MAX = 0, 1, 2, 3, 4


def _group_size(pg_obj, what):
    pg = torch.distributed.ProcessGroup.unbox(pg_obj)
    n = world.world_size()
    if pg.size() != n:
        raise LazyXlaError(f"lazyxla: torch.distributed.{what} on lazy tensors over a group of {pg.size()} "
                           f"processes: only a group of every process ({n}) is supported "
                           f"(at {fmt_where(user_frame(3))})")
    return n


def _reduction(op_obj, what, n):
    """(lazyxla reduce type, scale) of a c10d ReduceOp."""
    op = op_obj._get_method("op")()
    if op == _SUM:
        return coll.REDUCE_SUM, 1.0
    if op == _AVG:
        return coll.REDUCE_SUM, 1.0 / n
    if op == _MAX:
        return coll.REDUCE_MAX, 1.0
    if op == _MIN:
        return coll.REDUCE_MIN, 1.0
    raise LazyXlaError(f"lazyxla: torch.distributed.{what} with ReduceOp {op} on lazy tensors is not supported "
                       f"(SUM, AVG, MAX, MIN) (at {fmt_where(user_frame(3))})")


def _done(value):
    fut = torch.futures.Future()
    fut.set_result(value)
    return torch._C._distributed_c10d._create_work_from_future(fut).boxed()  # as the op schema returns it


def _allreduce(func, info, args, kwargs):
    tensors, pg, op = args[0], args[1], args[2]
    n = _group_size(pg, "all_reduce")
    kind, scale = _reduction(op, "all_reduce", n)
    coll.all_reduce(kind, tensors, scale=scale)  # in place, as one collective (DDP's buckets too)
    return tensors, _done(tensors)


def _broadcast(func, info, args, kwargs):
    tensors, pg, root = args[0], args[1], args[2]
    _group_size(pg, "broadcast")
    for t in tensors:
        coll.copy_into(t, coll.broadcast(t, root))
    return tensors, _done(tensors)


def _allgather(func, info, args, kwargs):
    outputs, inputs, pg = args[0], args[1], args[2]
    _group_size(pg, "all_gather")
    for outs, t in zip(outputs, inputs):
        gathered = coll.all_gather(t.reshape((1,) + tuple(t.shape)), dim=0)
        for r, o in enumerate(outs):
            coll.copy_into(o, gathered[r])
    return outputs, _done(outputs)


def _allgather_base(func, info, args, kwargs):
    out, inp, pg = args[0], args[1], args[2]
    _group_size(pg, "all_gather_into_tensor")
    coll.copy_into(out, coll.all_gather(inp, dim=0).reshape(out.shape))
    return out, _done(out)


def _sum_scale(op, what, n):
    """The scale of a SUM or AVG reduction (the only ones a reduce-scatter takes here)."""
    kind, scale = _reduction(op, what, n)
    if kind != coll.REDUCE_SUM:
        raise LazyXlaError(f"lazyxla: torch.distributed.{what} on lazy tensors supports SUM and AVG "
                           f"(at {fmt_where(user_frame(3))})")
    return scale


def _reduce_scatter(func, info, args, kwargs):
    outputs, inputs, pg, op = args[0], args[1], args[2], args[3]
    n = _group_size(pg, "reduce_scatter")
    scale = _sum_scale(op, "reduce_scatter", n)
    for o, parts in zip(outputs, inputs):
        coll.copy_into(o, coll.reduce_scatter(coll.REDUCE_SUM, torch.stack(list(parts)), scale, 0, n)[0])
    return outputs, _done(outputs)


def _reduce_scatter_base(func, info, args, kwargs):
    out, inp, pg, op = args[0], args[1], args[2], args[3]
    n = _group_size(pg, "reduce_scatter_tensor")
    scale = _sum_scale(op, "reduce_scatter_tensor", n)
    coll.copy_into(out, coll.reduce_scatter(coll.REDUCE_SUM, inp, scale, 0, n).reshape(out.shape))
    return out, _done(out)


def _create_backend(store, rank, size, timeout):
    if world.world_size() == 1 and size > 1:
        world.init(rank=rank, world_size=size)
    if world.world_size() != size or world.global_ordinal() != rank:
        raise LazyXlaError(f"lazyxla: init_process_group as rank {rank} of {size}, but this process joined the "
                           f"job as rank {world.global_ordinal()} of {world.world_size()}")
    return torch.distributed.ProcessGroupGloo(store, rank, size, timeout)


def register():
    if not torch.distributed.is_available():
        return
    from ..frontend.ops import SPECIAL
    c10d = torch.ops.c10d
    SPECIAL.update({
        c10d.allreduce_.default: _allreduce,
        c10d.broadcast_.default: _broadcast,
        c10d.allgather_.default: _allgather,
        c10d._allgather_base_.default: _allgather_base,
        c10d.reduce_scatter_.default: _reduce_scatter,
        c10d._reduce_scatter_base_.default: _reduce_scatter_base,
    })
    dist = torch.distributed
    if "lazyxla" not in dist.Backend.backend_list:
        dist.Backend.register_backend("lazyxla", _create_backend, devices=["cpu", "lazyxla"])


def _rendezvous_here(url, timeout=None, **kwargs):
    """An init_method for a process that is a world of one, or a job ``world`` joined (torchrun's
    or ``spawn``'s environment: MASTER_ADDR and MASTER_PORT)."""
    if world.world_size() == 1:
        yield torch.distributed.HashStore(), 0, 1
        return
    yield from torch.distributed.rendezvous("env://", world.global_ordinal(), world.world_size())


def register_alias(name: str) -> None:
    """Register this backend under another name too (``"xla"`` for torch_xla scripts), with an
    ``<name>://`` init_method that takes the job's ranks from ``world`` (torch_xla's ``xla://``)."""
    dist = torch.distributed
    if not dist.is_available():
        return
    register()
    if name not in dist.Backend.backend_list:
        dist.Backend.register_backend(name, _create_backend, devices=["cpu", "lazyxla"])
    try:
        dist.register_rendezvous_handler(name, _rendezvous_here)
    except (AttributeError, RuntimeError):  # already registered
        pass
