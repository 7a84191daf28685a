"""Reductions (sum, mean, prod, max/min, arg-max/min, any/all, var/std, vector norms,
logsumexp), scans (cumsum, cumprod), sort and top-k as JAX functions.

Reductions accumulate in float32 for half types and in int64 for integer sums, as
PyTorch does; ops taking a dim run a 0-d input as a 1-element vector (``zero_d="input"``).
Touches only the registry.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..xla import jnp_dtype
from .registry import register


def _dims(x, dim):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    if isinstance(dim, int):
        dim = (dim,)
    return tuple(d % max(x.ndim, 1) for d in dim)


def _out_dt(sig, i=0):
    return jnp_dtype(sig.outs[i].dtype)


def _acc(x, out_dt):
    if x.dtype in (jnp.float16, jnp.bfloat16):
        return x.astype(jnp.float32)
    if out_dt is not None and x.dtype != out_dt:
        return x.astype(out_dt)
    return x


@register("sum.default", "sum.dim_IntList", zero_d="input")
def _sum(sig, x, dim=None, keepdim=False, dtype=None):
    od = _out_dt(sig)
    return jnp.sum(_acc(x, od), axis=_dims(x, dim), keepdims=keepdim)


@register("mean.default", "mean.dim", zero_d="input")
def _mean(sig, x, dim=None, keepdim=False, dtype=None):
    od = _out_dt(sig)
    return jnp.mean(_acc(x, od), axis=_dims(x, dim), keepdims=keepdim)


@register("prod.default", "prod.dim_int", zero_d="input")
def _prod(sig, x, dim=None, keepdim=False, dtype=None):
    od = _out_dt(sig)
    return jnp.prod(_acc(x, od), axis=_dims(x, dim), keepdims=keepdim)


@register("amax.default", zero_d="input")
def _amax(sig, x, dim=(), keepdim=False):
    return jnp.max(x, axis=_dims(x, dim), keepdims=keepdim)


@register("amin.default", zero_d="input")
def _amin(sig, x, dim=(), keepdim=False):
    return jnp.min(x, axis=_dims(x, dim), keepdims=keepdim)


@register("max.default")
def _max_all(sig, x):
    return jnp.max(x)


@register("min.default")
def _min_all(sig, x):
    return jnp.min(x)


@register("max.dim", zero_d="input")
def _max_dim(sig, x, dim, keepdim=False):
    d = dim % max(x.ndim, 1)
    return jnp.max(x, axis=d, keepdims=keepdim), jnp.argmax(x, axis=d, keepdims=keepdim)


@register("min.dim", zero_d="input")
def _min_dim(sig, x, dim, keepdim=False):
    d = dim % max(x.ndim, 1)
    return jnp.min(x, axis=d, keepdims=keepdim), jnp.argmin(x, axis=d, keepdims=keepdim)


@register("argmax.default", zero_d="input")
def _argmax(sig, x, dim=None, keepdim=False):
    if dim is None:
        r = jnp.argmax(x.reshape(-1))
        return r.reshape((1,) * x.ndim) if keepdim else r
    return jnp.argmax(x, axis=dim % max(x.ndim, 1), keepdims=keepdim)


@register("argmin.default", zero_d="input")
def _argmin(sig, x, dim=None, keepdim=False):
    if dim is None:
        r = jnp.argmin(x.reshape(-1))
        return r.reshape((1,) * x.ndim) if keepdim else r
    return jnp.argmin(x, axis=dim % max(x.ndim, 1), keepdims=keepdim)


@register("any.default", "any.dim", "any.dims", zero_d="input")
def _any(sig, x, dim=None, keepdim=False):
    return jnp.any(x, axis=_dims(x, dim), keepdims=keepdim)


@register("all.default", "all.dim", "all.dims", zero_d="input")
def _all(sig, x, dim=None, keepdim=False):
    return jnp.all(x, axis=_dims(x, dim), keepdims=keepdim)


@register("_is_all_true.default")  # torch.distributions' argument checks
def _is_all_true(sig, x):
    return jnp.all(x)


@register("_is_any_true.default")
def _is_any_true(sig, x):
    return jnp.any(x)


def _correction(correction, unbiased=None):
    if correction is None:
        return 1
    return correction


@register("var.correction", zero_d="input")
def _var(sig, x, dim=None, correction=None, keepdim=False):
    xa = _acc(x, None)
    return jnp.var(xa, axis=_dims(x, dim), ddof=_correction(correction), keepdims=keepdim)


@register("std.correction", zero_d="input")
def _std(sig, x, dim=None, correction=None, keepdim=False):
    xa = _acc(x, None)
    return jnp.std(xa, axis=_dims(x, dim), ddof=_correction(correction), keepdims=keepdim)


@register("var_mean.correction", zero_d="input")
def _var_mean(sig, x, dim=None, correction=None, keepdim=False):
    xa = _acc(x, None)
    ax = _dims(x, dim)
    return jnp.var(xa, axis=ax, ddof=_correction(correction), keepdims=keepdim), jnp.mean(xa, axis=ax, keepdims=keepdim)


@register("linalg_vector_norm.default", static=("ord",), zero_d="input")
def _vnorm(sig, x, ord=2, dim=None, keepdim=False, dtype=None):
    xa = jnp.abs(_acc(x, None))
    ax = _dims(x, dim)
    ordv = float(ord)
    if ordv == float("inf"):
        return jnp.max(xa, axis=ax, keepdims=keepdim)
    if ordv == float("-inf"):
        return jnp.min(xa, axis=ax, keepdims=keepdim)
    if ordv == 0:
        return jnp.sum((xa != 0).astype(xa.dtype), axis=ax, keepdims=keepdim)
    if ordv == 1:
        return jnp.sum(xa, axis=ax, keepdims=keepdim)
    if ordv == 2:
        return jnp.sqrt(jnp.sum(xa * xa, axis=ax, keepdims=keepdim))
    return jnp.sum(xa ** ordv, axis=ax, keepdims=keepdim) ** (1.0 / ordv)


@register("logsumexp.default", zero_d="input")
def _logsumexp(sig, x, dim, keepdim=False):
    return jax.scipy.special.logsumexp(_acc(x, None), axis=_dims(x, dim), keepdims=keepdim)


@register("cumsum.default", zero_d="input")
def _cumsum(sig, x, dim, dtype=None):
    return jnp.cumsum(_acc(x, _out_dt(sig)), axis=dim % max(x.ndim, 1))


@register("cumprod.default", zero_d="input")
def _cumprod(sig, x, dim, dtype=None):
    return jnp.cumprod(_acc(x, _out_dt(sig)), axis=dim % max(x.ndim, 1))


@register("sort.default", "sort.stable", zero_d="input")
def _sort(sig, x, *a, dim=-1, descending=False, stable=None):
    if a:  # sort.default(self, dim, descending)
        dim = a[0]
        descending = a[1] if len(a) > 1 else descending
    d = dim % max(x.ndim, 1)
    key = -x if descending and not jnp.issubdtype(x.dtype, jnp.bool_) else x
    idx = jnp.argsort(key, axis=d, stable=True)
    return jnp.take_along_axis(x, idx, axis=d), idx


@register("topk.default", zero_d="input")
def _topk(sig, x, k, dim=-1, largest=True, sorted=True):
    d = dim % max(x.ndim, 1)
    xm = jnp.moveaxis(x, d, -1)
    v, i = jax.lax.top_k(xm if largest else -xm, k)
    if not largest:
        v = -v
    return jnp.moveaxis(v, -1, d), jnp.moveaxis(i, -1, d)
