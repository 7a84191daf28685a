"""Collectives across the job's processes, recorded in the lazy graph (torch_xla's names).

``all_reduce``, ``all_gather`` and ``reduce_scatter`` add a node to the pending IR, as any
op does: at ``sync()`` it is part of the step's one program, lowered to JAX's collectives
over the process axis (``lowering.collective``). A node's signature holds the reduction, the
scale and the world size, so the graph hash covers them. ``optimizer_step`` averages the
gradients across processes, then steps; ``rendezvous`` waits for every process. In a single
process they are what they amount to there (``all_reduce`` with a scale scales).

May touch: the tensors given (``all_reduce`` of a list, ``optimizer_step``'s gradients are
written in place) and JAX's distributed runtime (``rendezvous``).
"""
from __future__ import annotations

import torch

from ..frontend import param_moves
from ..errors import LazyXlaError
from ..ir.node import Node, OpSig, Slot, TensorMeta
from ..ir.user_line import fmt_where, user_frame
from ..lowering import lower_all_gather, lower_all_reduce, lower_broadcast, lower_reduce_scatter
from ..engine.executor import sync
from ..run.storage import fresh
from ..frontend.tensor import LazyTensor
from . import world

REDUCE_SUM, REDUCE_MAX, REDUCE_MIN = "sum", "max", "min"
_SIGS: dict = {}


def _check(what, t, where):
    if type(t) is not LazyTensor:
        raise LazyXlaError(f"lazyxla.distributed.{what}: expects tensors on lazyxla.device(), got one on "
                           f"{getattr(t, 'device', type(t).__name__)} at {fmt_where(where)}")


def _check_groups(what, groups, where):
    if groups:
        everyone = list(range(world.world_size()))
        if [sorted(g) for g in groups] != [everyone]:
            raise LazyXlaError(f"lazyxla.distributed.{what}: groups {groups} are not supported (only every "
                               f"process, {everyone}) at {fmt_where(where)}")


def _node(op, lower, tensors, metas, kwargs, where):
    """One collective node over ``tensors`` (operands), giving values of ``metas``."""
    k = (op, metas, kwargs)
    sig = _SIGS.get(k)
    if sig is None:
        sig = _SIGS[k] = OpSig(op, None, lower, (tuple(Slot(i) for i in range(len(tensors))), kwargs), metas)
    return Node(sig, tuple(t._state.value() for t in tensors), where)


def _record(op, lower, t, out_shape, kwargs, where):
    meta = TensorMeta(tuple(out_shape), t.dtype)
    return LazyTensor(fresh((_node(op, lower, (t,), (meta,), kwargs, where), 0), meta))


def copy_into(dst, value):
    """Write ``value`` into the lazy tensor ``dst`` (an output argument, a list all-reduced in
    place), outside autograd."""
    with torch.no_grad():
        dst.copy_(value)
    return dst


def all_reduce(reduce_type, inputs, scale=1.0, groups=None, pin_layout=True):
    """Reduce across processes (``REDUCE_SUM``, ``REDUCE_MAX``, ``REDUCE_MIN``), times ``scale``.
    A tensor: returns the result. A list of tensors: writes each result in place, returns it."""
    where = user_frame(2)
    if reduce_type not in (REDUCE_SUM, REDUCE_MAX, REDUCE_MIN):
        raise LazyXlaError(f"lazyxla.distributed.all_reduce: reduce type {reduce_type!r} is not supported "
                           f"(REDUCE_SUM, REDUCE_MAX, REDUCE_MIN) at {fmt_where(where)}")
    _check_groups("all_reduce", groups, where)
    kwargs = (("reduce_type", reduce_type), ("scale", float(scale)), ("world", world.world_size()))
    one = isinstance(inputs, torch.Tensor)
    tensors = [inputs] if one else list(inputs)
    for t in tensors:
        _check("all_reduce", t, where)
    if not tensors:
        return tensors
    if world.world_size() == 1 and float(scale) == 1.0:  # the reduction over one process: the values
        return inputs.clone() if one else inputs
    # one node for all of them: they cross the processes as one message per dtype
    metas = tuple(TensorMeta(tuple(t.shape), t.dtype) for t in tensors)
    node = _node("xla::all_reduce", lower_all_reduce, tensors, metas, kwargs, where)
    results = [LazyTensor(fresh((node, i), m)) for i, m in enumerate(metas)]
    if one:
        return results[0]
    for t, r in zip(tensors, results):
        copy_into(t, r)
    return tensors


def all_gather(value, dim=0, groups=None, output=None, pin_layout=True):
    """Every process's ``value`` concatenated along ``dim``, in rank order."""
    where = user_frame(2)
    _check("all_gather", value, where)
    _check_groups("all_gather", groups, where)
    dim = dim % max(value.dim(), 1)
    shape = list(value.shape)
    shape[dim] *= world.world_size()
    out = _record("xla::all_gather", lower_all_gather, value, shape, (("dim", dim), ("world", world.world_size())),
                  where)
    return out if output is None else copy_into(output, out)


def reduce_scatter(reduce_type, input, scale, scatter_dim, shard_count, groups=None, output=None,
                   pin_layout=True):
    """Reduce across processes (``REDUCE_SUM``), times ``scale``, then keep this process's
    block of ``shard_count`` (the world size) along ``scatter_dim``."""
    where = user_frame(2)
    _check("reduce_scatter", input, where)
    _check_groups("reduce_scatter", groups, where)
    n = world.world_size()
    if reduce_type != REDUCE_SUM:
        raise LazyXlaError(f"lazyxla.distributed.reduce_scatter: reduce type {reduce_type!r} is not supported "
                           f"(REDUCE_SUM) at {fmt_where(where)}")
    if shard_count != n:
        raise LazyXlaError(f"lazyxla.distributed.reduce_scatter: shard_count {shard_count} is not the world size "
                           f"{n} at {fmt_where(where)}")
    dim = scatter_dim % input.dim()
    if input.shape[dim] % n:
        raise LazyXlaError(f"lazyxla.distributed.reduce_scatter: dimension {dim} of shape {list(input.shape)} "
                           f"does not split into {n} equal blocks at {fmt_where(where)}")
    shape = list(input.shape)
    shape[dim] //= n
    out = _record("xla::reduce_scatter", lower_reduce_scatter, input, shape,
                  (("reduce_type", reduce_type), ("scale", float(scale)), ("dim", dim), ("world", n)), where)
    return out if output is None else copy_into(output, out)


def broadcast(t, root: int = 0):
    """Process ``root``'s ``t``, in every process."""
    where = user_frame(2)
    _check("broadcast", t, where)
    n = world.world_size()
    if not 0 <= root < n:
        raise LazyXlaError(f"lazyxla.distributed.broadcast: root {root} is not a rank of the {n} processes at "
                           f"{fmt_where(where)}")
    return _record("xla::broadcast", lower_broadcast, t, t.shape, (("root", int(root)), ("world", n)), where)


def gradients(optimizer) -> list:
    """The gradients of the optimizer's parameters that have one, in its order (torch_xla's
    ``xm._fetch_gradients``). An optimizer made before its model moved to the device follows
    the moved parameters first (``param_moves``): their gradients are the ones to reduce."""
    param_moves.follow(optimizer)
    return [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]


def broadcast_(tensors, root: int = 0):
    """Process ``root``'s value of each tensor in the list, written into it in every process
    (torch_xla's ``xm.collective_broadcast``)."""
    for t in tensors:
        copy_into(t, broadcast(t, root))
    return tensors


def reduce_gradients(optimizer, groups=None, pin_layout=True):
    """Average every parameter's gradient across processes (in place)."""
    n = world.world_size()
    if n > 1:
        all_reduce(REDUCE_SUM, gradients(optimizer), scale=1.0 / n, groups=groups)


def optimizer_step(optimizer, barrier=False, optimizer_args=None, groups=None, pin_layout=True):
    """torch_xla's ``xm.optimizer_step``: average the gradients across processes, then
    ``optimizer.step(**optimizer_args)``; returns what it returns."""
    reduce_gradients(optimizer, groups=groups)
    loss = optimizer.step(**(optimizer_args or {}))
    if barrier:
        sync()
    return loss


def rendezvous(tag: str, payload: bytes = b"", replicas=()):
    """Wait until every process reaches the rendezvous ``tag``."""
    if payload:
        raise LazyXlaError("lazyxla.distributed.rendezvous: exchanging a payload is not supported; "
                           "use all_gather on a tensor")
    if world.world_size() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(str(tag))
    return []
