"""Random ops, drawn from the step's seed graph (R8), as JAX functions.

Every random op receives ``__seed__``: an int64 value of the seed chain that ``rng`` builds
in IR (``seed' = 2531011 + 214013 * seed``), so the program depends on how many random ops
there are, never on the seed's value. The bits come from JAX's PRNG keyed by that value:
XLA's RngBitGenerator (``LAZYXLA_PRNG_IMPL``, ``rbg``; ``threefry2x32`` is JAX's default).
Touches only the registry.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..xla import widths
from ..xla.client import PRNG_IMPL, jnp_dtype
from .program import report
from .registry import register


# XLA's RngBitGenerator by default (``xla.PRNG_IMPL``): JAX's threefry is some twenty rounds of
# integer ops fused into each random op's kernel, which XLA:CPU compiles for 0.3 s per shape (HF
# BERT depth 2: 2.31 s -> 1.54 s to compile), for ~20% less time drawing the bits
def _key(seed):
    """The key of a seed: its bits as unsigned, 64 of them, or 32 where the seed is held in 32
    (a uint64 in a 32-bit trace would send the program to the 64-bit one: ``xla.widths``)."""
    if hasattr(seed, "astype"):
        seed = seed.astype(jnp.uint64 if seed.dtype == jnp.int64 else jnp.uint32)
    return jax.random.key(seed, impl=PRNG_IMPL)


def _ints(key, shape, low, high):
    """Integers in [low, high) as the trace holds int64; where that is 32 bits, bounds int32
    cannot hold are an OverflowError (its op and line added by the program)."""
    dt = widths.long_dtype()
    if dt == jnp.int32:
        widths.check_scalar(low)
        widths.check_scalar(high - 1)
    return jax.random.randint(key, shape, low, high, dtype=dt)


def _meta(sig, i=0):
    m = sig.outs[i]
    return m.shape, jnp_dtype(m.dtype)


def _fdt(dt):
    return dt if jnp.issubdtype(dt, jnp.floating) else jnp.float32


@register("normal_.default", random=True)
def _normal_(sig, x, mean=0.0, std=1.0, generator=None, __seed__=None):
    shape, dt = _meta(sig)
    z = jax.random.normal(_key(__seed__), shape, jnp.float32 if dt in (jnp.float16, jnp.bfloat16) else _fdt(dt))
    return z * std + mean


@register("uniform_.default", "uniform.default", random=True)
def _uniform_(sig, x, from_=0.0, to=1.0, generator=None, __seed__=None, **k):
    shape, dt = _meta(sig)
    lo = k.get("from", from_)
    u = jax.random.uniform(_key(__seed__), shape, jnp.float32 if dt in (jnp.float16, jnp.bfloat16) else _fdt(dt))
    return lo + u * (to - lo)


@register("rand.default", "rand_like.default", random=True)
def _rand(sig, *a, __seed__=None, **k):
    shape, dt = _meta(sig)
    return jax.random.uniform(_key(__seed__), shape, _fdt(dt))


@register("randn.default", "randn_like.default", random=True)
def _randn(sig, *a, __seed__=None, **k):
    shape, dt = _meta(sig)
    return jax.random.normal(_key(__seed__), shape, _fdt(dt))


@register("randint.default", "randint.low", "randint_like.default", "randint_like.low_dtype", random=True)
def _randint(sig, *a, __seed__=None, **k):
    shape, dt = _meta(sig)
    ints = [x for x in a if isinstance(x, int)]
    low, high = (0, ints[0]) if len(ints) == 1 else (ints[0], ints[1])
    return _ints(_key(__seed__), shape, low, high)


@register("random_.from", "random_.to", "random_.default", "random.from", "random.to", "random.default",
          random=True)
def _random_(sig, x, *a, __seed__=None, **k):
    """Integers in [from, to), by default [0, 2**mantissa] for floats and [0, max] for ints."""
    shape, dt = _meta(sig)
    ints = [v for v in a if isinstance(v, int)]
    if len(a) >= 2 or (len(a) == 1 and "from" in sig.op):  # random.from: to may be None
        low, high = ints[0], (ints[1] if len(ints) > 1 else None)
    else:
        low, high = 0, (ints[0] if ints else None)
    if high is None:
        if jnp.issubdtype(dt, jnp.floating):
            high = 2 ** (jnp.finfo(dt).nmant + 1) + 1
        elif dt == jnp.bool_:
            high = 2
        else:
            high = int(jnp.iinfo(dt).max) + (1 if jnp.iinfo(dt).bits < 64 else 0)
    return _ints(_key(__seed__), shape, low, high)


@register("randperm.default", random=True)
def _randperm(sig, n, *a, __seed__=None, **k):
    return jax.random.permutation(_key(__seed__), n)


@register("bernoulli_.float", "bernoulli.p", random=True)
def _bernoulli_p(sig, x, p=0.5, generator=None, __seed__=None):
    shape, dt = _meta(sig)
    return jax.random.bernoulli(_key(__seed__), p, shape)


@register("bernoulli.default", "bernoulli_.Tensor", "bernoulli.Tensor", random=True)
def _bernoulli(sig, x, *a, generator=None, __seed__=None, **k):
    shape, dt = _meta(sig)
    p = a[0] if a and hasattr(a[0], "shape") else x
    return jax.random.uniform(_key(__seed__), shape, jnp.float32) < p.astype(jnp.float32)


@register("exponential_.default", "exponential.default", random=True)
def _exponential_(sig, x, lambd=1.0, generator=None, __seed__=None):
    shape, dt = _meta(sig)
    return jax.random.exponential(_key(__seed__), shape, _fdt(dt)) / lambd


@register("native_dropout.default", random=True)
def _native_dropout(sig, x, p, train, __seed__=None):
    if train is False or p == 0:  # train=None means training, as in PyTorch
        return x, jnp.ones(x.shape, jnp.bool_)
    keep = jax.random.bernoulli(_key(__seed__), 1.0 - p, x.shape)
    scale = 1.0 / (1.0 - p) if p < 1 else 0.0
    return jnp.where(keep, x * jnp.asarray(scale, x.dtype), jnp.zeros((), x.dtype)), keep


@register("native_dropout_backward.default")
def _native_dropout_backward(sig, grad, mask, scale):
    # a floating grad keeps its dtype (the scale is a weak-typed Python number); a bool or
    # integer one is promoted by the scale, as PyTorch promotes it
    return grad * mask.astype(grad.dtype) * scale


@register("multinomial.default", random=True)
def _multinomial(sig, probs, num_samples, replacement=False, generator=None, __seed__=None):
    p = probs.astype(jnp.float32)
    zero = jnp.zeros((), widths.long_dtype())
    report(jnp.any(~jnp.isfinite(p) | (p < 0)), zero, "probability tensor contains either `inf`, `nan` or element < 0")
    report(jnp.any(jnp.sum(p, axis=-1) <= 0), zero, "invalid multinomial distribution (sum of probabilities <= 0)")
    logits = jnp.log(p)
    key = _key(__seed__)
    if replacement:
        return jax.random.categorical(key, logits, axis=-1, shape=(num_samples,) + probs.shape[:-1]).T \
            if probs.ndim == 2 else jax.random.categorical(key, logits, shape=(num_samples,))
    g = jax.random.gumbel(key, probs.shape, jnp.float32)
    return jax.lax.top_k(logits + g, num_samples)[1]
