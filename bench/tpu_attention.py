"""Attention on a TPU: lazyxla's XLA lowering beside JAX's Pallas kernels, forward and backward.

One causal attention of a GPT-2 layer (``--batch`` 8 x ``--heads`` 12 x ``--seq`` 1024 x 64,
bf16), its forward and its three gradients in one ``jax.jit`` program, for each candidate:

- ``xla``: lazyxla's own lowering (``lowering.attention``: the scores in bf16, a float32 softmax,
  the row log-sum-exp kept for the backward);
- ``flash/<q>x<k>``: JAX's Pallas flash attention kernel with query and key blocks of that size
  (``flash/128x128`` is its default), its backward by ``jax.vjp``;
- ``splash/<q>x<kv>``: JAX's Pallas splash attention kernel (block-sparse: the causal mask's
  empty blocks skipped), the batch by ``vmap``, its backward by ``jax.vjp``.

Each candidate reports ms per forward and backward (median of ``--repeats`` rounds of
``--steps`` calls), its largest difference from ``xla`` in the output and the gradients, and
``(4 + 8) B H T^2 d / 2`` flops' rate (a causal forward and backward). ``lowering.tpu_kernels``
takes its kernel and blocks from the fastest exact candidate. Needs a TPU (or ``--interpret``
with a small ``--seq`` to try it on a CPU).

Usage: python bench/tpu_attention.py [--batch 8] [--heads 12] [--seq 1024] [--candidates xla,flash/128x128,...]
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import time

import jax
import jax.numpy as jnp

DEFAULT = ("xla,flash/128x128,flash/512x512,flash/1024x512,splash/512x512,splash/512x1024,"
           "splash/1024x1024,splash/256x512")


def xla_attention(q, k, v, scale):
    from lazyxla.lowering.attention import _attention, _attention_backward

    @jax.custom_vjp
    def f(q, k, v):
        return _attention(None, q, k, v, None, True, scale, False)[0]

    def fwd(q, k, v):
        out, lse = _attention(None, q, k, v, None, True, scale, False)
        return out, (q, k, v, out, lse)

    def bwd(res, g):
        q, k, v, out, lse = res
        return _attention_backward(None, g, q, k, v, None, out, lse, True, scale, False)

    f.defvjp(fwd, bwd)
    return f(q, k, v)


def flash(q, k, v, scale, bq, bk, interpret=False):
    from jax.experimental.pallas.ops.tpu import flash_attention as fa
    bq, bk = min(bq, q.shape[2]), min(bk, k.shape[2])
    blocks = fa.BlockSizes(block_q=bq, block_k_major=bk, block_k=bk, block_b=1,
                           block_q_major_dkv=bq, block_k_major_dkv=bk, block_k_dkv=bk, block_q_dkv=bq,
                           block_k_major_dq=bk, block_k_dq=bk, block_q_dq=bq)
    if interpret:
        from jax.experimental.pallas import tpu as pltpu
        with pltpu.force_tpu_interpret_mode():
            return fa.flash_attention(q, k, v, causal=True, sm_scale=scale, block_sizes=blocks)
    return fa.flash_attention(q, k, v, causal=True, sm_scale=scale, block_sizes=blocks)


def splash(q, k, v, scale, bq, bkv, interpret=False):
    from jax.experimental.pallas.ops.tpu import splash_attention as sa
    B, H, T, _ = q.shape
    bq, bkv = min(bq, T), min(bkv, T)
    mask = sa.MultiHeadMask([sa.CausalMask((T, T)) for _ in range(H)])
    blocks = sa.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq, block_kv_dkv=bkv,
                           block_kv_dkv_compute=bkv, block_q_dq=bq, block_kv_dq=bkv)
    kernel = sa.make_splash_mha(mask, block_sizes=blocks, head_shards=1, q_seq_shards=1, interpret=interpret)
    return jax.vmap(kernel)((q * jnp.asarray(scale, q.dtype)), k, v)


def candidate(name, interpret):
    kind, _, blocks = name.partition("/")
    if kind == "xla":
        return xla_attention
    a, b = (int(x) for x in blocks.split("x"))
    if kind == "flash":
        return functools.partial(flash, bq=a, bk=b, interpret=interpret)
    return functools.partial(splash, bq=a, bkv=b, interpret=interpret)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--candidates", default=DEFAULT)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--interpret", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    B, H, T, d = args.batch, args.heads, args.seq, args.dim
    key = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v, g = (jax.random.normal(kk, (B, H, T, d), jnp.bfloat16) for kk in key)
    scale = 1.0 / math.sqrt(d)
    flops = 12 * B * H * T * T * d / 2
    rows, ref = [], None
    print(f"attention B{B} x H{H} x T{T} x d{d}, bf16, causal, forward + backward; {jax.devices()[0].platform}")
    for name in args.candidates.split(","):
        fn = candidate(name, args.interpret)

        def fwd_bwd(q, k, v, g, fn=fn, kernel=not name.startswith("xla")):
            with jax.enable_x64(not kernel):  # the kernels index in int32 (lazyxla runs JAX with 64-bit types)
                out, pull = jax.vjp(lambda a, b, c: fn(a, b, c, scale), q, k, v)
                return (out,) + tuple(pull(g))

        try:
            t0 = time.perf_counter()
            step = jax.jit(fwd_bwd).lower(q, k, v, g).compile()
            res = jax.block_until_ready(step(q, k, v, g))
            compile_s = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - a block size the kernel refuses: reported, not fatal
            print(f"  {name:18s} failed: {type(e).__name__}: {str(e).splitlines()[0][:150]}")
            continue
        rounds = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for _ in range(args.steps):
                res = step(q, k, v, g)
            jax.block_until_ready(res)
            rounds.append((time.perf_counter() - t0) / args.steps * 1e3)
        ms = statistics.median(rounds)
        if ref is None:
            ref = [r.astype(jnp.float32) for r in res]
        diff = [float(jnp.max(jnp.abs(r.astype(jnp.float32) - w))) for r, w in zip(res, ref)]
        rows.append({"candidate": name, "ms": ms, "rounds": rounds, "tflops": flops / ms / 1e9,
                     "max_diff": dict(zip(("out", "dq", "dk", "dv"), diff)), "compile_s": compile_s})
        print(f"  {name:18s} {ms:7.3f} ms  {flops / ms / 1e9:6.1f} TFLOP/s  diff vs first: out {diff[0]:.3g} "
              f"dq {diff[1]:.3g} dk {diff[2]:.3g} dv {diff[3]:.3g}  (compile {compile_s:.1f} s)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
