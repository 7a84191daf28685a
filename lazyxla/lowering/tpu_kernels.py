"""Pallas kernels for the TPU: which XLA lowering one replaces, and when (``RULES``).

A kernel here is JAX's own (``jax.experimental.pallas.ops.tpu``), called from the lowering it
replaces when that lowering's call fits the kernel; anything else keeps the XLA lowering.
``LAZYXLA_TPU_KERNELS`` (``xla.client``): ``on`` (the default: the kernels on a TPU, the XLA
lowerings elsewhere), ``off``, ``interpret`` (the kernels on any platform, run by Pallas'
interpreter: what the tests on a CPU use). What a process does is part of the compile
environment when kernels replace lowerings (``on`` on a TPU, ``interpret``).

Measured on a v5e (``bench/tpu_attention.py``, ``bench/tpu.py``, docs/guide/tpu.md): the
splash kernel computes GPT-2's causal attention (8 x 12 x 1024 x 64, bf16, forward and
backward) in 1.83 ms against the XLA lowering's 2.61, JAX's flash kernel in 2.78 at its best
blocks (7.94 at its default 128 x 128); GPT-2 124M's replayed step 74.8 ms against 79.1.

Touches nothing.
"""
from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..xla import precision
from ..xla.client import tpu_kernels_mode

BLOCK = 128  # the kernels' smallest blocks: a sequence length must be a multiple of it

# kernel -> (the XLA lowering it replaces, when it does)
RULES = {
    "splash_attention": ("lazyxla::attention and its backward", "4-d query, key and value (grouped key/value "
                         "heads repeated), no mask but the causal one (then as many queries as keys), both "
                         f"lengths multiples of {BLOCK}, the values as wide as the keys; bfloat16, or float32 "
                         "at mat_mul_precision 'default'"),
}

# the attention kernel's blocks (query rows x key columns, forward and both backward kernels),
# the largest that divide the lengths: measured by bench/tpu_attention.py on a v5e (GPT-2's
# 8 x 12 x 1024 x 64, bf16, causal, forward and backward): see docs/guide/tpu.md
ATTENTION_BLOCKS = (512, 512)


def _active() -> bool:
    return tpu_kernels_mode() != "off"


@contextlib.contextmanager
def _scope():
    """A kernel's trace: 32-bit JAX (the kernels index in int32; lazyxla runs JAX with 64-bit
    types), products at the kernel's own precision, and Pallas' interpreter in ``interpret``
    mode. The kernels run only where one bfloat16 pass is the products' precision (``RULES``):
    traced under a program's ``'high'`` or ``'highest'`` (``xla.precision.scope``), their
    bfloat16 products would ask Mosaic for float32 contraction, which it refuses ("failed to
    legalize"; a v5e, bfloat16 attention at ``'highest'``)."""
    with jax.enable_x64(False), jax.default_matmul_precision("default"):
        if tpu_kernels_mode() == "interpret":
            from jax.experimental.pallas import tpu as pltpu
            with pltpu.force_tpu_interpret_mode():
                yield
        else:
            yield


def attention_fits(q, k, v, mask, is_causal) -> bool:
    """Whether ``splash_attention`` computes this attention (``RULES``)."""
    if not _active() or mask is not None or q.ndim != 4 or k.shape[-1] != v.shape[-1] or q.shape[-1] != k.shape[-1]:
        return False
    L, S = q.shape[-2], k.shape[-2]
    if is_causal and L != S:
        return False
    if L % BLOCK or S % BLOCK:
        return False
    # float32 only at 'default', where a product may be one bfloat16 pass: the kernel's products
    # promise no more than that
    return q.dtype == jnp.bfloat16 or (q.dtype == jnp.float32 and precision.get_mat_mul_precision() == "default")


def _blocks(length, want):
    """The largest multiple of BLOCK up to ``want`` that divides ``length``."""
    b = min(want, length) // BLOCK * BLOCK
    while length % b:
        b -= BLOCK
    return b


@functools.lru_cache(maxsize=64)
def _splash_kernel(heads, L, S, is_causal, interpret):
    """The splash kernel for these heads and lengths, as its pytree's structure and leaves (the
    masks' block tables) in numpy. Making it (the masks' tables, numpy work) took most of the
    1.1 s GPT-2 124M's trace spent in the kernel on a v5e's host, once per layer's call; it is
    made once per shape, outside any trace (a JAX array made inside one trace and kept would be
    another trace's closed-over constant)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa
    bq, bkv = _blocks(L, ATTENTION_BLOCKS[0]), _blocks(S, ATTENTION_BLOCKS[1])
    one = sa.CausalMask((L, S)) if is_causal else sa.FullMask((L, S))
    blocks = sa.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq, block_kv_dkv=bkv,
                           block_kv_dkv_compute=bkv, block_q_dq=bq, block_kv_dq=bkv)
    with jax.ensure_compile_time_eval():
        kernel = sa.make_splash_mha(sa.MultiHeadMask([one] * heads), block_sizes=blocks, head_shards=1,
                                    q_seq_shards=1, interpret=interpret)
    leaves, tree = jax.tree_util.tree_flatten(kernel)
    return tree, tuple(np.asarray(leaf) for leaf in leaves)


def _splash(q, k, v, is_causal, scale):
    """Splash attention (JAX's block-sparse Pallas kernel: a causal mask's empty blocks are
    skipped), the batch by ``vmap``; the kernel does not scale, so the queries are scaled first."""
    _, H, L, _ = q.shape
    tree, leaves = _splash_kernel(H, L, k.shape[2], bool(is_causal), tpu_kernels_mode() == "interpret")
    kernel = jax.tree_util.tree_unflatten(tree, [jnp.asarray(leaf) for leaf in leaves])
    return jax.vmap(kernel)(q * jnp.asarray(scale, q.dtype), k, v)


def attention(q, k, v, is_causal, scale):
    """The attention's output (keys and values already one per query head). Computed as the
    backward's ``jax.vjp`` computes it (the kernel's forward that keeps its residuals), so the
    program holds one forward kernel call that XLA shares between the two."""
    with _scope():
        out, _ = jax.vjp(lambda a, b, c: _splash(a, b, c, is_causal, scale), q, k, v)
        return out


def attention_backward(grad, q, k, v, is_causal, scale):
    """(dq, dk, dv) of ``attention``: the kernel's own backward, from the forward's residuals."""
    with _scope():
        _, pull = jax.vjp(lambda a, b, c: _splash(a, b, c, is_causal, scale), q, k, v)
        return pull(grad.astype(q.dtype))
