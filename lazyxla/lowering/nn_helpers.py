"""Helpers shared by the neural-network families (``conv``, ``pooling``, ``resample``,
``softmax``, ``loss``, ``layer_norm``, ``embedding``, ``activation``) and ``distance``.

Numerics follow PyTorch's eager CPU kernels: half precision inputs (bf16/f16) are computed in
float32 (``_f``; the caller casts the results back) and scalar arguments take an operand's
dtype (``_s``). Backward ops of smooth or linear forwards are the ``jax.vjp`` of the forward
lowering (``_vjp``); backward ops with an ``output_mask`` build their outputs with
``_masked``. ``_ntuple`` reads PyTorch's ``int[N]`` arguments. ``tanh`` is float64's tanh
where float64 is emulated too (``elementwise``'s as well).

Registers nothing and touches nothing.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def tanh(x):
    """``jnp.tanh``, its float64 argument clamped to [-20, 20], where float64's tanh is +-1
    already (1 - tanh(20) < 2**-54): XLA's TPU float64 (two float32s) gave NaN past that (a v5e,
    2026-12-07: gelu's tanh approximation at 25.0, its argument 578)."""
    if x.dtype == jnp.float64:
        x = jnp.clip(x, -20.0, 20.0)
    return jnp.tanh(x)


def _f(x):
    """Upcast half-precision floats to float32 (PyTorch's CPU opmath type)."""
    if x is not None and x.dtype in (jnp.bfloat16, jnp.float16):
        return x.astype(jnp.float32)
    return x


def _s(v, like):
    """A scalar argument (Python number or 0-d array) in the dtype of ``like``."""
    return jnp.asarray(v, dtype=like.dtype)


def _ntuple(v, n):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return tuple(v * n if len(v) == 1 else v)


def _vjp(fn, primals, cotangent):
    """Gradients of ``fn`` at ``primals`` for the output cotangent (one per primal)."""
    out, pull = jax.vjp(fn, *primals)
    return pull(jnp.broadcast_to(cotangent, out.shape).astype(out.dtype))


def _masked(sig, present, makers):
    """Outputs of a backward op with ``output_mask``: ``makers[i]()`` for each present
    output; an absent output (PyTorch's meta returns None) is zeros shaped like its meta
    when ``sig.outs`` keeps a slot for it, else it is left out of the tuple."""
    if len(sig.outs) == len(makers):
        res = []
        for p, make, meta in zip(present, makers, sig.outs):
            if p:
                res.append(make())
            else:
                res.append(jnp.zeros(tuple(meta.shape) if meta is not None else (), jnp.float32))
        return tuple(res)
    return tuple(make() for p, make in zip(present, makers) if p)
