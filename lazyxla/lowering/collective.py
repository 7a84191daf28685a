"""Lowerings of the cross-process collectives (``xla::all_reduce``, ``xla::all_gather``,
``xla::reduce_scatter``, ``xla::broadcast``): JAX's ``psum``/``pmax``/``pmin``, ``all_gather``,
``psum_scatter`` and a masked ``psum`` over the process axis ``PROCESS_AXIS``, which the compiler binds when the
process has joined a job of several (``xla.process_mesh``). In a job of one process they are
what the collective amounts to there (a scaled copy, or the value itself).
May touch: nothing."""
from __future__ import annotations

import jax

PROCESS_AXIS = "proc"  # the name the compiler gives the process axis of its mesh
_REDUCERS = {"sum": jax.lax.psum, "max": jax.lax.pmax, "min": jax.lax.pmin}


def lower_all_gather(sig, x, dim=0, world=1):
    if world == 1:
        return x
    return jax.lax.all_gather(x, PROCESS_AXIS, axis=dim, tiled=True)


def lower_reduce_scatter(sig, x, reduce_type="sum", scale=1.0, dim=0, world=1):
    if world > 1:
        x = jax.lax.psum_scatter(x, PROCESS_AXIS, scatter_dimension=dim, tiled=True)
    return x * scale if scale != 1.0 else x


def lower_broadcast(sig, x, root=0, world=1):
    if world == 1:
        return x
    mine = jax.lax.axis_index(PROCESS_AXIS) == root
    return jax.lax.psum(jax.numpy.where(mine, x, jax.numpy.zeros_like(x)), PROCESS_AXIS)


def lower_all_reduce(sig, *xs, reduce_type="sum", scale=1.0, world=1):
    """One or several tensors reduced as one collective: those of one dtype are flattened into
    one buffer, so the processes exchange one message per dtype, not one per tensor."""
    if world == 1:
        return tuple(x * scale if scale != 1.0 else x for x in xs)
    out = list(xs)
    by_dtype: dict = {}
    for i, x in enumerate(xs):
        by_dtype.setdefault(jax.numpy.dtype(x.dtype), []).append(i)
    for idx in by_dtype.values():
        flat = jax.numpy.concatenate([jax.numpy.ravel(xs[i]) for i in idx])
        flat = _REDUCERS[reduce_type](flat, PROCESS_AXIS)
        if scale != 1.0:
            flat = flat * scale
        start = 0
        for i in idx:
            n = xs[i].size
            out[i] = flat[start:start + n].reshape(xs[i].shape)
            start += n
    return tuple(out)
