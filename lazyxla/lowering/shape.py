"""Views, their copying forms (``select_copy``, ``slice_copy``, ``split_copy``, ...: the view,
copied), the scatters that write through views, and data movement (cat, stack, flip, roll,
repeat, padding and the replication padding's backward, tril/triu) in JAX.

View lowerings must be pure index remappings of their input: ``lower_view_scatter``
applies them to an index map to write through a view. ``select_scatter``,
``slice_scatter``, ``diagonal_scatter`` and ``as_strided_scatter`` (their functional
inverses) reuse the view's index arithmetic. Indexing by index tensors (gather, scatter,
index_put) is in ``indexing``. Touches only the registry.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..xla.client import jnp_dtype
from .program import read_row, stack_rows
from .registry import register


def _shape(sig, i=0):
    return sig.outs[i].shape


@register("view.default", "_unsafe_view.default", "reshape.default", "view_copy.default",
          "_reshape_alias.default", "expand_copy.default")
def _view(sig, x, *a, **k):
    return jnp.reshape(x, _shape(sig)) if x.size == int(np.prod(_shape(sig), dtype=np.int64)) \
        else jnp.broadcast_to(x, _shape(sig))


@register("alias.default", "lift_fresh.default", "detach.default", "detach_copy.default")
def _alias(sig, x):
    return x


# -- the other view-copy ops whose views lazyxla handles elsewhere (functional: no aliasing)
@register("_reshape_copy.default", "_reshape_alias_copy.default")
def _reshape_copy(sig, x, *a):
    return jnp.reshape(x, _shape(sig))


@register("_neg_view_copy.default")
def _neg_view_copy(sig, x):
    return -x






@register("t.default")
def _t(sig, x):
    return x.T if x.ndim == 2 else x


@register("transpose.int")
def _transpose(sig, x, d0, d1):
    return jnp.swapaxes(x, d0, d1) if x.ndim else x


@register("permute.default")
def _permute(sig, x, dims):
    return jnp.transpose(x, [d % x.ndim for d in dims]) if x.ndim else x


@register("expand.default")
def _expand(sig, x, size, implicit=False):
    return jnp.broadcast_to(x, _shape(sig))


@register("unsqueeze.default", "squeeze.default", "squeeze.dim", "squeeze.dims", "flatten.using_ints",
          "unflatten.int")
def _reshape_like(sig, x, *a):
    return jnp.reshape(x, _shape(sig))


@register("select.int", "select_copy.int")
def _select(sig, x, dim, index):
    d = dim % x.ndim
    if isinstance(index, int):
        k = index % x.shape[d]
        if d == 0:  # a row of x (a stacked parameter's): stack_rows takes runs of them as slices of x
            return read_row(x, k)
        return jnp.take(x, k, axis=d)
    return jnp.take(x, index, axis=d)


def _slice_bounds(n, start, end, step):
    start = 0 if start is None else start
    end = n if end is None else end
    if start < 0:
        start += n
    if end < 0:
        end += n
    start = min(max(start, 0), n)
    end = min(max(end, start), n)
    return start, end, step


@register("slice.Tensor", "slice_copy.Tensor")
def _slice(sig, x, dim=0, start=None, end=None, step=1):
    d = dim % x.ndim
    s, e, st = _slice_bounds(x.shape[d], start, end, step)
    idx = [slice(None)] * x.ndim
    idx[d] = slice(s, e, st)
    return x[tuple(idx)]


@register("narrow.default")
def _narrow(sig, x, dim, start, length):
    d = dim % x.ndim
    if start < 0:
        start += x.shape[d]
    idx = [slice(None)] * x.ndim
    idx[d] = slice(start, start + length)
    return x[tuple(idx)]


@register("diagonal.default")
def _diagonal(sig, x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, dim1 % x.ndim, dim2 % x.ndim)


@register("as_strided.default")
def _as_strided(sig, x, size, stride, storage_offset=None):
    off = storage_offset or 0
    idx = np.full(tuple(size), off, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        idx = idx + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    return jnp.take(x.reshape(-1), jnp.asarray(idx))


@register("split.Tensor", "split_copy.Tensor")
def _split(sig, x, split_size, dim=0):
    d = dim % x.ndim
    n = x.shape[d]
    bounds = list(range(split_size, n, split_size)) if split_size > 0 else []
    return tuple(jnp.split(x, bounds, axis=d))


@register("split_with_sizes.default")
def _split_sizes(sig, x, sizes, dim=0):
    d = dim % x.ndim
    return tuple(jnp.split(x, np.cumsum(sizes)[:-1].tolist(), axis=d))


@register("unbind.int")
def _unbind(sig, x, dim=0):
    d = dim % x.ndim
    return tuple(jnp.take(x, i, axis=d) for i in range(x.shape[d]))


@register("unfold.default", zero_d="input")
def _unfold(sig, x, dim, size, step):
    d = dim % max(x.ndim, 1)
    n = (x.shape[d] - size) // step + 1
    idx = (np.arange(n)[:, None] * step + np.arange(size)[None, :])
    y = jnp.take(x, jnp.asarray(idx.reshape(-1)), axis=d)
    y = y.reshape(x.shape[:d] + (n, size) + x.shape[d + 1:])
    return jnp.moveaxis(y, d + 1, -1)


# -- data movement -------------------------------------------------------------------------
@register("cat.default")
def _cat(sig, tensors, dim=0):
    dt = jnp_dtype(sig.outs[0].dtype)
    ts = [t.astype(dt) for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not ts:
        return jnp.zeros(_shape(sig), dt)
    return jnp.concatenate(ts, axis=dim % ts[0].ndim)


@register("stack.default")
def _stack(sig, tensors, dim=0):
    dt = jnp_dtype(sig.outs[0].dtype)
    d = dim % (tensors[0].ndim + 1)
    if d == 0 and all(t.dtype == dt for t in tensors):
        return stack_rows(tensors)  # (rows of a stack, as ``scan_layers`` stacks a stacked parameter's: that stack)
    return jnp.stack([t.astype(dt) for t in tensors], axis=d)


@register("flip.default")
def _flip(sig, x, dims):
    return jnp.flip(x, axis=tuple(d % x.ndim for d in dims))


@register("roll.default")
def _roll(sig, x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), axis=tuple(dims))


@register("repeat.default")
def _repeat(sig, x, repeats):
    pad = len(repeats) - x.ndim
    return jnp.tile(x.reshape((1,) * pad + x.shape), tuple(repeats))


@register("constant_pad_nd.default")
def _pad(sig, x, pad, value=0):
    cfg = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        d = x.ndim - 1 - i
        cfg[d] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x, jnp.asarray(value, x.dtype), cfg)


def _replicate_index(n, lo, hi):
    """Input position of each output position of a replication pad (negative pads crop)."""
    return np.clip(np.arange(n + lo + hi) - lo, 0, n - 1)


def _replication_pad(x, padding):
    k = len(padding) // 2
    for i in range(k):   # padding lists the last dim first
        ax = x.ndim - 1 - i
        x = jnp.take(x, jnp.asarray(_replicate_index(x.shape[ax], padding[2 * i], padding[2 * i + 1])), axis=ax)
    return x


@register("replication_pad1d_backward.default", "replication_pad2d_backward.default",
          "replication_pad3d_backward.default")
def _replication_pad_backward(sig, grad, x, padding):
    """Each output's gradient added to the input element it copies."""
    out, pull = jax.vjp(lambda x_: _replication_pad(x_, padding), x.astype(grad.dtype))
    return pull(grad.reshape(out.shape))[0]


@register("tril.default")
def _tril(sig, x, diagonal=0):
    return jnp.tril(x, diagonal)


@register("triu.default")
def _triu(sig, x, diagonal=0):
    return jnp.triu(x, diagonal)


# -- writing through a view ----------------------------------------------------------------
@register("select_scatter.default")
def _select_scatter(sig, x, src, dim, index):
    d = dim % x.ndim
    idx = [slice(None)] * x.ndim
    idx[d] = index
    return x.at[tuple(idx)].set(src.astype(x.dtype))


@register("slice_scatter.default")
def _slice_scatter(sig, x, src, dim=0, start=None, end=None, step=1):
    d = dim % x.ndim
    s, e, st = _slice_bounds(x.shape[d], start, end, step)
    idx = [slice(None)] * x.ndim
    idx[d] = slice(s, e, st)
    return x.at[tuple(idx)].set(src.astype(x.dtype))


@register("diagonal_scatter.default")
def _diagonal_scatter(sig, x, src, offset=0, dim1=0, dim2=1):
    n = x.size
    ids = jnp.arange(n).reshape(x.shape)
    m = jnp.diagonal(ids, offset, dim1 % x.ndim, dim2 % x.ndim)
    return x.reshape(-1).at[m.reshape(-1)].set(src.reshape(-1).astype(x.dtype)).reshape(x.shape)


@register("as_strided_scatter.default")
def _as_strided_scatter(sig, x, src, size, stride, storage_offset=None):
    ids = _as_strided(sig, jnp.arange(x.size), size, stride, storage_offset)
    return x.reshape(-1).at[ids.reshape(-1)].set(src.reshape(-1).astype(x.dtype)).reshape(x.shape)
