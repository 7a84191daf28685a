"""Padding rules of views, slices and writes into them, concatenation, flips and factories: where
a padded dimension goes, and positions counted from the real end.

May touch: nothing.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..program import lower_call
from .core import (_any, _args, _broadcast_kinds, _count_ints, _dim, _merged, mask, overload_name,  # noqa: F401
                   real)


def _sizes_at(positions):
    """A factory or view whose integers at these template argument indices are sizes."""
    def check(c):
        out_kinds, moving, template = c.out_kinds, c.moving, c.template
        targs = template[0]
        allowed = set()
        pos = 0
        for i, a in enumerate(targs):
            n = _count_ints(a)
            if i in positions:
                allowed.update(range(pos, pos + n))
            pos += n
        for k, v in template[1]:
            n = _count_ints(v)
            if k in ("size", "end") and k in positions:
                allowed.update(range(pos, pos + n))
            pos += n
        if set(moving) - allowed:
            return "an integer parameter that is not a size follows a padded size"
        return out_kinds  # a new tensor of those sizes (``new_*``'s operand gives only its dtype)
    return check


def _groups(src, dst):
    """Reshape groups: lists of (source dims, destination dims) whose sizes multiply equally."""
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        gi, gj = [], []
        pi = pj = 1
        while True:
            if pi == pj and gi and gj:
                # absorb size-1 dims into this group
                while i < len(src) and src[i] == 1 and (j >= len(dst) or dst[j] != 1):
                    gi.append(i)
                    i += 1
                while j < len(dst) and dst[j] == 1 and (i >= len(src) or src[i] != 1):
                    gj.append(j)
                    j += 1
                break
            if (pi <= pj or j >= len(dst)) and i < len(src):
                pi *= src[i]
                gi.append(i)
                i += 1
            elif j < len(dst):
                pj *= dst[j]
                gj.append(j)
                j += 1
            else:
                break
        groups.append((gi, gj))
    return groups


def view(c):
    """A reshape keeps the real values leading when a padded dimension is the outermost of
    the dimensions it is merged with or split into; merged behind others it becomes a merged
    kind, which only the reshape back undoes."""
    got = _sizes_at({1})(c.but(in_kinds=()))
    if isinstance(got, str):
        return got
    ik = c.in_kinds[0]
    src_shape, dst_shape = c.in_shapes[0], c.inner.outs[0].shape
    out = list(c.out_kinds[0])
    for gi, gj in _groups(list(src_shape), list(dst_shape)):
        if not _any([ik[d] for d in gi]):
            if any(out[d] is not None for d in gj):
                return "a reshape makes a padded dimension from dimensions that are not"
            continue
        lead_i = [d for d in gi if src_shape[d] != 1 or ik[d] is not None]
        lead_j = [d for d in gj if dst_shape[d] != 1 or out[d] is not None]
        first = ik[lead_i[0]]
        if len(lead_i) == 1 and len(lead_j) == 1:
            out[lead_j[0]] = first  # the dimension itself (its size-1 neighbours aside)
        elif first is not None and first[0] == "p" and all(ik[d] is None for d in lead_i[1:]) \
                and out[lead_j[0]] is not None and all(out[d] is None for d in lead_j[1:]):
            pass  # the padded dimension is the outermost on both sides: its real values still lead
        elif len(lead_j) == 1 and all(ik[d] is None or ik[d][0] == "p" for d in lead_i):
            out[lead_j[0]] = ("m", tuple((src_shape[d], ik[d]) for d in lead_i))
        elif len(lead_i) == 1 and first is not None and first[0] == "m" and \
                tuple(s for s, _ in first[1]) == tuple(dst_shape[d] for d in lead_j):
            for d, (_, k) in zip(lead_j, first[1]):
                out[d] = k
        else:
            return "a reshape moves padded values out of place"
    return (tuple(out),)


def expand(c):
    in_kinds, out_kinds = c.in_kinds, c.out_kinds
    got = _sizes_at({1})(c.but(in_kinds=()))
    if isinstance(got, str):
        return got
    return _broadcast_kinds(in_kinds, out_kinds)


def _moved(fn):
    """Views that move dimensions: the output's kinds are the input's, moved the same way."""
    def check(c):
        in_kinds, template = c.in_kinds, c.template
        targs, _ = template
        return (tuple(fn(list(in_kinds[0]), targs)),)
    return check


def _permute(k, targs):
    return [k[_dim(d, len(k))] for d in targs[1]]


def _transpose(k, targs):
    a, b = _dim(targs[1], len(k)), _dim(targs[2], len(k))
    k[a], k[b] = k[b], k[a]
    return k


def _t(k, targs):
    return k[::-1]


def _unsqueeze(k, targs):
    d = _dim(targs[1], len(k) + 1)
    return k[:d] + [None] + k[d:]


def squeeze(c):
    in_kinds, template = c.in_kinds, c.template
    targs = template[0]
    k = list(in_kinds[0])
    shape = c.in_shapes[0]
    dims = range(len(k)) if len(targs) < 2 else (targs[1] if isinstance(targs[1], tuple) else (targs[1],))
    dims = {_dim(d, len(k)) for d in dims}
    if any(k[d] is not None for d in dims):
        return "squeezes a padded dimension (its size 1 could be the real size)"
    return (tuple(x for i, x in enumerate(k) if not (i in dims and shape[i] == 1)),)


def slice_(c):
    in_kinds, out_kinds, moving, template = c.in_kinds, c.out_kinds, c.moving, c.template
    targs = template[0]
    rank = len(in_kinds[0])
    dim = _dim(targs[1] if len(targs) > 1 else 0, rank)
    start = targs[2] if len(targs) > 2 else None
    step = targs[4] if len(targs) > 4 else 1
    k = in_kinds[0][dim]
    n_before = _count_ints(targs[:2])
    start_moves = n_before in moving and start is not None
    if step != 1 and (k is not None or moving):
        return "a strided slice of a padded dimension"
    if k is not None and k[0] == "m":
        return "a slice of a merged padded dimension"
    out = list(in_kinds[0])
    out[dim] = out_kinds[0][dim]
    if start_moves or (k is not None and start is not None and start < 0):
        if out[dim] is not None:
            return "a slice from a position counted from the end, of a length that varies"
        return (tuple(out),)  # lowered with the real start (slice_lower)
    if k is None and out[dim] is not None and (start or 0) < 0:
        return "a slice counted from the end"
    return (tuple(out),)


def slice_lower(inner, vals, sizes, info):
    """A slice whose start counts from the real end (negative, or following a size) starts at
    the real position (a dynamic slice of the output's static length); others slice as they are."""
    targs, _ = _args(inner)
    x = vals[0]
    rank = x.ndim
    dim = _dim(targs[1] if len(targs) > 1 else 0, rank)
    start = targs[2] if len(targs) > 2 else None
    k = info[0][0][dim]
    at = _count_ints(targs[:2])
    mv = info[2].get(at)
    if start is None or not (mv is not None or (k is not None and start < 0)):
        return lower_call(inner, vals)
    if mv is not None:
        v, a, b = mv
        begin = a * sizes[v] + b
        if start < 0:
            begin = begin + real(k, sizes, x.shape[dim])
    else:
        begin = real(k, sizes, x.shape[dim]) + start
    length = inner.outs[0].shape[dim]
    starts = [jnp.zeros((), jnp.int32)] * rank
    starts[dim] = jnp.asarray(begin, jnp.int32)
    return jax.lax.dynamic_slice(x, starts, [length if d == dim else x.shape[d] for d in range(rank)])


def select(c):
    in_kinds, template = c.in_kinds, c.template
    targs = template[0]
    k = list(in_kinds[0])
    dim = _dim(targs[1], len(k))
    if k[dim] is not None and k[dim][0] == "m":
        return "an index into a merged padded dimension"
    del k[dim]
    return (tuple(k),)


def select_lower(inner, vals, sizes, info):
    targs, _ = _args(inner)
    x = vals[0]
    dim = _dim(targs[1], x.ndim)
    index = targs[2]
    kd = info[0][0][dim]
    mv = info[2].get(_count_ints(targs[:2]))
    if mv is None and (kd is None or index >= 0):
        return lower_call(inner, vals)
    if mv is not None:
        i = mv[1] * sizes[mv[0]] + mv[2]  # an index that follows a size: its real value
    else:
        i = real(kd, sizes, x.shape[dim]) + index  # counted from the real end
    i = jnp.asarray(i, jnp.int32)
    return jax.lax.dynamic_index_in_dim(x, i, dim, keepdims=False)


def flip(c):
    """flip: along a padded dimension the real values are reversed in place (the padding stays behind)."""
    k = c.in_kinds[0]
    for d in c.template[0][1]:
        x = k[_dim(d, len(k))]
        if x is not None and x[0] == "m":
            return "flips a merged padded dimension"
    return (k,)


def flip_lower(inner, vals, sizes, info):
    targs, _ = _args(inner)
    x = vals[0]
    k = info[0][0]
    for d in targs[1]:
        d = _dim(d, x.ndim)
        if k[d] is None:
            x = jnp.flip(x, d)
        else:
            n = x.shape[d]
            idx = jnp.clip(real(k[d], sizes, n) - 1 - jnp.arange(n, dtype=jnp.int32), 0, n - 1)
            x = jnp.take(x, idx, axis=d)
    return x


def scatter_view(c):
    """select_scatter / slice_scatter (the backward of select and slice): the output is the
    base's layout; the written position counts from the real end when negative (lowered
    with a dynamic update)."""
    targs = c.template[0]
    k = c.in_kinds[0]
    dim = _dim(targs[2] if len(targs) > 2 else 0, len(k))
    if k[dim] is not None and k[dim][0] == "m":
        return "writes into a merged padded dimension"
    step = targs[5] if len(targs) > 5 else 1
    if step != 1 and (k[dim] is not None or c.moving):
        return "a strided write into a padded dimension"
    if "slice" in overload_name(c.inner.func) and c.in_kinds[1][dim] is not None and k[dim] is None:
        return "writes a padded block into a dimension that is not padded"
    return (_merged(c.out_kinds[0], k),)


def scatter_view_lower(inner, vals, sizes, info):
    """Write ``src`` into ``base``; only the real elements of ``src`` are written (its padding
    could land on real positions of ``base``, as in ``x[:, :-1]``'s backward), at the real
    position when the start counts from the end."""
    base, src = vals[0], vals[1]
    ks = info[0][1]
    written = _scatter_view(inner, base, src, sizes, info)
    if not _any(ks):
        return written
    m = jnp.broadcast_to(mask(src.shape, ks, sizes), src.shape)
    wm = _scatter_view(inner, jnp.zeros(base.shape, jnp.float32), m.astype(jnp.float32), sizes, info)
    return jnp.where(wm > 0, written, base)


def _scatter_view(inner, base, src, sizes, info):
    targs, _ = _args(inner)
    dim = _dim(targs[2] if len(targs) > 2 else 0, base.ndim)
    at = _count_ints(targs[:3])
    start = targs[3] if len(targs) > 3 else 0
    start = 0 if start is None else start
    kd = info[0][0][dim]
    mv = info[2].get(at)
    if mv is None and (kd is None or start >= 0):
        return lower_call(inner, [base, src])[0].astype(base.dtype)
    begin = (mv[1] * sizes[mv[0]] + mv[2]) if mv is not None else start
    if start < 0:
        begin = begin + real(kd, sizes, base.shape[dim])
    if "select" in overload_name(inner.func):
        src = jnp.expand_dims(src, dim)
    starts = [jnp.zeros((), jnp.int32)] * base.ndim
    starts[dim] = jnp.asarray(begin, jnp.int32)
    return jax.lax.dynamic_update_slice(base, src.astype(base.dtype), starts)


def along(dim_arg, allow_padded=True):
    """Ops that work along one dimension and keep the others elementwise: the output keeps
    the input's kinds; the dimension itself may be padded only if ``allow_padded``."""
    def check(c):
        in_kinds, out_kinds, template = c.in_kinds, c.out_kinds, c.template
        targs = template[0]
        k = in_kinds[0]
        d = _dim(targs[dim_arg] if len(targs) > dim_arg else 0, len(k))
        if k and k[d] is not None and not allow_padded:
            return "works along a padded dimension"
        if k and k[d] is not None and k[d][0] == "m":
            return "works along a merged padded dimension"
        return _broadcast_kinds(in_kinds, out_kinds)
    return check


def cat(c):
    in_kinds, out_kinds, template = c.in_kinds, c.out_kinds, c.template
    targs = template[0]
    rank = len(out_kinds[0])
    d = _dim(targs[1] if len(targs) > 1 else 0, rank)
    ks = [k for k in in_kinds if len(k) == rank]
    if any(k[d] is not None for k in ks):
        return "concatenates along a padded dimension"
    out = list(out_kinds[0])
    for k in ks:
        for i, x in enumerate(k):
            if x is not None:
                if out[i] is not None and out[i] != x and out[i][0] != "p":
                    return "its operands are padded differently"
                out[i] = x
    return (tuple(out),)


def stack(c):
    in_kinds, out_kinds, template = c.in_kinds, c.out_kinds, c.template
    d = _dim(template[0][1] if len(template[0]) > 1 else 0, len(out_kinds[0]))
    k = list(in_kinds[0])
    if any(x != in_kinds[0] for x in in_kinds):
        return "its operands are padded differently"
    return (tuple(k[:d] + [None] + k[d:]),)
