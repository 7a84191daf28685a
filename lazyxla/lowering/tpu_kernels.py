"""Pallas kernels for the TPU: which XLA lowering one replaces, and when (``RULES``).

A kernel here is JAX's own (``jax.experimental.pallas.ops.tpu``), called from the lowering it
replaces when that lowering's call fits the kernel; anything else keeps the XLA lowering.
``LAZYXLA_TPU_KERNELS``: ``off`` (the default until each kernel is measured against its XLA
lowering on the chip: ``bench/tpu.py``), ``on`` (the kernels on a TPU; XLA lowerings
elsewhere), ``interpret`` (the kernels on any platform, run by Pallas' interpreter: what the
tests on a CPU use). The setting changes programs, so it is part of the compile environment
(``xla.client.compile_environment``) when it is not ``off``.

Touches nothing.
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp

from ..config import env_str
from ..xla.client import jax_device

MODE = env_str("LAZYXLA_TPU_KERNELS", "off").strip().lower() or "off"
if MODE not in ("off", "on", "interpret"):
    raise ValueError(f"LAZYXLA_TPU_KERNELS={MODE!r}: one of off, on, interpret")

BLOCK = 128  # the kernels' default blocks: a sequence length must be a multiple of it

# kernel -> (the XLA lowering it replaces, when it does)
RULES = {
    "flash_attention": ("lazyxla::attention and its backward", "4-d query, key and value (grouped key/value "
                        "heads repeated), no mask but the causal one (then as many queries as keys), both "
                        f"lengths multiples of {BLOCK}, the values as wide as the keys"),
}


def _active() -> bool:
    if MODE == "off":
        return False
    return MODE == "interpret" or jax_device().platform == "tpu"


@contextlib.contextmanager
def _scope():
    """A kernel's trace: 32-bit JAX (the kernels index in int32; lazyxla runs JAX with 64-bit
    types), and Pallas' interpreter in ``interpret`` mode."""
    with jax.enable_x64(False):
        if MODE == "interpret":
            from jax.experimental.pallas import tpu as pltpu
            with pltpu.force_tpu_interpret_mode():
                yield
        else:
            yield


def attention_fits(q, k, v, mask, is_causal) -> bool:
    """Whether ``flash_attention`` computes this attention (``RULES``)."""
    if not _active() or mask is not None or q.ndim != 4 or k.shape[-1] != v.shape[-1] or q.shape[-1] != k.shape[-1]:
        return False
    L, S = q.shape[-2], k.shape[-2]
    if is_causal and L != S:
        return False
    return L % BLOCK == 0 and S % BLOCK == 0 and q.dtype in (jnp.bfloat16, jnp.float32)


def _flash(q, k, v, is_causal, scale):
    from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention
    return flash_attention(q, k, v, causal=bool(is_causal), sm_scale=float(scale))


def attention(q, k, v, is_causal, scale):
    """The attention's output (keys and values already one per query head)."""
    with _scope():
        return _flash(q, k, v, is_causal, scale)


def attention_backward(grad, q, k, v, is_causal, scale):
    """(dq, dk, dv) of ``attention``: the kernel's own backward (its forward run again inside)."""
    with _scope():
        _, pull = jax.vjp(lambda a, b, c: _flash(a, b, c, is_causal, scale), q, k, v)
        return pull(grad)
