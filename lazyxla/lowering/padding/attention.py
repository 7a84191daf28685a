"""Padding rule of attention (``lazyxla::attention`` and its backward): the queries' length and
the keys' length may be padded, each by its own size variable, and batch or head dimensions
alike in the query, key and value.

What it keeps exact: a padded key is never attended (the keys past the real length join the
mask: ``-inf`` before the softmax), so every real query's probabilities, output and row
log-sum-exp are the exact graph's; a padded query row computes on the padding and leaves it
behind. The causal mask is aligned at the top left, so padding at the end leaves it as it is
for the real rows. The backward reads only real values: the padding of the gradient, the
inputs and the forward's output is taken as zero (and its log-sum-exp as 0), so a padded row
or key adds nothing to the real rows' gradients. The head dimension is never padded.

May touch: nothing.
"""
from __future__ import annotations

import jax.numpy as jnp

from ..attention import _attention, _attention_backward
from .core import _merged, masked, real


def _keys_kept(mask, key_kind, sizes, length):
    """The mask with the keys past their real length masked out (a bool [S], or joined to the
    user's boolean or additive mask); the mask itself when the keys are not padded."""
    if key_kind is None:
        return mask
    keep = jnp.arange(length, dtype=jnp.int32) < real(key_kind, sizes, length)
    if mask is None:
        return keep
    if mask.dtype == jnp.bool_:
        return mask & keep
    return jnp.where(keep, mask, jnp.asarray(-jnp.inf, mask.dtype))


def _check(kq, kk, kv, km):
    if any(k[-1] is not None for k in (kq, kk, kv)):
        return "its head dimension is padded"
    if any(x is not None and x[0] != "p" for x in (kq[-2], kk[-2])):
        return "its lengths are merged with other padded dimensions"
    if not (tuple(kq[:-2]) == tuple(kk[:-2]) == tuple(kv[:-2])):
        return "its query, key and value are padded differently along a batch or head dimension"
    if kk[-2] != kv[-2]:
        return "its keys and values are padded differently along their length"
    if km is not None:
        want = tuple(kq[:-2]) + (kq[-2], kk[-2])
        for j, x in enumerate(km):
            d = len(want) - len(km) + j
            if x is not None and (d < 0 or want[d] != x):
                return "its mask is padded differently from its scores"
    return None


def attention(c):
    targs = c.template[0]
    kinds = c.in_kinds
    kq, kk, kv = kinds[0], kinds[1], kinds[2]
    km = kinds[3] if targs[3] is not None else None
    why = _check(kq, kk, kv, km)
    if why:
        return why
    return (_merged(c.out_kinds[0], tuple(kq[:-1]) + (None,)), _merged(c.out_kinds[1], tuple(kq[:-1])))


def attention_lower(inner, vals, sizes, info):
    targs = inner.template[0]
    kinds = info[0]
    has_mask = targs[3] is not None
    q = vals[0]
    k, v = masked(vals[1], kinds[1], sizes, 0), masked(vals[2], kinds[2], sizes, 0)
    mask = _keys_kept(vals[3] if has_mask else None, kinds[1][-2], sizes, k.shape[-2])
    return _attention(inner, q, k, v, mask, *targs[4:7])


def attention_backward(c):
    targs = c.template[0]
    kinds = c.in_kinds
    has_mask = targs[4] is not None
    kg, kq, kk, kv = kinds[0], kinds[1], kinds[2], kinds[3]
    km = kinds[4] if has_mask else None
    ko, kl = kinds[4 + has_mask], kinds[5 + has_mask]
    why = _check(kq, kk, kv, km)
    if why:
        return why
    if tuple(kg[:-1]) != tuple(kq[:-1]) or tuple(ko) != tuple(kg) or tuple(kl) != tuple(kq[:-1]):
        return "its gradient, output or log-sum-exp is padded differently from its queries"
    return tuple(_merged(o, tuple(k)) for o, k in zip(c.out_kinds, (kq, kk, kv)))


def attention_backward_lower(inner, vals, sizes, info):
    targs = inner.template[0]
    kinds = info[0]
    has_mask = targs[4] is not None
    zero = [masked(vals[i], kinds[i], sizes, 0) for i in range(4)]
    grad, q, k, v = zero
    out = masked(vals[4 + has_mask], kinds[4 + has_mask], sizes, 0)
    lse = masked(vals[5 + has_mask], kinds[5 + has_mask], sizes, 0)
    mask = _keys_kept(vals[4] if has_mask else None, kinds[2][-2], sizes, k.shape[-2])
    return _attention_backward(inner, grad, q, k, v, mask, out, lse, *targs[7:10])
