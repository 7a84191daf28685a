"""Factories (empty, zeros, full, arange, eye, linspace, logspace, *_like) as JAX functions.

The output shape and dtype always come from ``sig.outs`` (PyTorch's own rules), so a
factory only decides the values. Touches only the registry.
"""
from __future__ import annotations

import jax.numpy as jnp

from ..xla.client import jnp_dtype
from .registry import register


def _meta(sig):
    m = sig.outs[0]
    return m.shape, jnp_dtype(m.dtype)


@register("empty.memory_format", "empty_like.default", "zeros.default", "zeros_like.default",
          "new_empty.default", "new_zeros.default", "empty_strided.default", "new_empty_strided.default",
          "_efficientzerotensor.default")
def _zeros(sig, *a, **k):
    shape, dt = _meta(sig)
    return jnp.zeros(shape, dt)


@register("ones.default", "ones_like.default", "new_ones.default")
def _ones(sig, *a, **k):
    shape, dt = _meta(sig)
    return jnp.ones(shape, dt)


@register("full.default")
def _full(sig, size, fill_value, **k):
    shape, dt = _meta(sig)
    return jnp.full(shape, jnp.asarray(fill_value).astype(dt), dt)


@register("full_like.default")
def _full_like(sig, x, fill_value, **k):
    shape, dt = _meta(sig)
    return jnp.full(shape, jnp.asarray(fill_value).astype(dt), dt)


@register("new_full.default")
def _new_full(sig, x, size, fill_value, **k):
    shape, dt = _meta(sig)
    return jnp.full(shape, jnp.asarray(fill_value).astype(dt), dt)


@register("scalar_tensor.default")
def _scalar_tensor(sig, s, **k):
    shape, dt = _meta(sig)
    return jnp.asarray(s).astype(dt)


@register("arange.default", "arange.start", "arange.start_step", static=("start", "end", "step"))
def _arange(sig, *a, **k):
    shape, dt = _meta(sig)
    nums = [x for x in a if isinstance(x, (int, float))]
    if len(nums) == 1:
        start, step = 0, 1
    elif len(nums) == 2:
        start, step = nums[0], 1
    else:
        start, step = nums[0], nums[2]
    return (start + step * jnp.arange(shape[0], dtype=jnp.float64)).astype(dt) \
        if isinstance(start, float) or isinstance(step, float) else (start + step * jnp.arange(shape[0])).astype(dt)


@register("linspace.default", static=("start", "end"))
def _linspace(sig, start, end, steps, **k):
    shape, dt = _meta(sig)
    return jnp.linspace(jnp.asarray(start, jnp.float64), jnp.asarray(end, jnp.float64), steps).astype(dt)


@register("logspace.default", static=("start", "end", "base"))
def _logspace(sig, start, end, steps, base=10.0, **k):
    shape, dt = _meta(sig)
    exps = jnp.linspace(jnp.asarray(start, jnp.float64), jnp.asarray(end, jnp.float64), steps)
    return jnp.power(jnp.float64(base), exps).astype(dt)


@register("eye.default", "eye.m")
def _eye(sig, n, m=None, **k):
    shape, dt = _meta(sig)
    return jnp.eye(shape[0], shape[1], dtype=dt)
