"""lazyxla's training step beside a hand-written JAX step of the same model, in one run.

The model is HF GPT-2 (124M at the defaults: 12 layers x 768, 12 heads, vocabulary 50257, tied
LM head, dropout off), trained with AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay
0.01) on one batch of ``--batch`` x ``--seq`` tokens, the loss HF's shifted cross entropy.

- ``lazyxla``: the HF model as a user writes it: ``model.to(dtype).to(lazyxla.device())``,
  ``torch.optim.AdamW``, ``model(input_ids=x, labels=x).loss.backward()``, ``opt.step()``,
  ``lazyxla.sync()`` per step;
- ``replay``: the same lazyxla step captured once and replayed (``lazyxla.compile(step,
  replay=True)``, AdamW ``capturable``): the program without the host's tracing of each step;
- ``jax``: the same model written in JAX here (``GPT2``: the weights are the HF model's, so the
  first losses agree), ``optax.adamw``, one ``jax.jit``'d step with its parameters and state
  donated. Attention is what a JAX user writes (the scores, a float32 softmax, the
  probabilities in the model's dtype times v), the layer norms and the loss in float32.

A variant named with ``+kernels`` (``replay+kernels``) runs with ``LAZYXLA_TPU_KERNELS=on`` (what
a user gets by default): the TPU's Pallas kernels (``lazyxla.lowering.tpu_kernels``) in place of
the XLA lowerings they replace; the others with ``off``: the XLA lowerings alone. With ``+rolled``
(``replay+kernels+rolled``) the model's layers are rolled into loops (``LAZYXLA_ROLL_MIN`` set
to the layer count; rolling's default starts at more layers than GPT-2 124M has). With ``+long64``
the device holds int64 in 64 bits (``XLA_USE_32BIT_LONG=0``; a TPU's default is 32:
``lazyxla.xla.widths``).

Each variant runs in a process of its own (one process holds a TPU), one after the other, and
reports: the first step's seconds (compile included; where they went: tracing, lowering,
XLA's compile), a steady step's ms (median of ``--repeats`` rounds of ``--steps`` steps), MFU
(``(6 N + 12 L D T) tokens / step / peak``, N the parameters, peak ``--peak-tflops``: 197 for a
v5e, in bf16), device memory: held (JAX's ``memory_stats()['peak_bytes_in_use']``: the buffers
the process holds between programs), the compiled step's own (``memory_analysis()``: arguments,
outputs, temporaries) and the peak (held + temporaries: ``peak_estimate``), and the first and
last losses.
The table's ratios are lazyxla's over JAX's, in the same run.

``--profile DIR``: each variant also writes a trace of 3 steps (``jax.profiler``) under
``DIR/<variant>``, which ``python -m lazyxla profile DIR/<variant>`` (or
``../shared/tools/tpu_op_profile.py``) reads. ``--precision``: lazyxla's matmul precision
(``lazyxla.backends.set_mat_mul_precision``) and JAX's (``jax_default_matmul_precision``), for
float32 runs. ``--tiny``: a 2-layer x 64 model on 2 x 32 tokens, to try the script on a CPU.

``--model llama``: a Llama-style decoder of the same size (RMSNorm, rotary embeddings, a gated
MLP, grouped key/value heads), lazyxla's variants only: its MFU beside GPT-2's.

Usage: python bench/tpu.py [--model gpt2|llama] [--layers 12] [--batch 8] [--seq 1024] [--dtype bf16|f32]
       [--variants jax,lazyxla,replay,replay+kernels] [--steps 10] [--repeats 3] [--profile DIR] [--json FILE] [--tiny]
Needs transformers (and optax for the JAX step).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VARIANTS = ("jax", "lazyxla", "replay")
# a lazyxla variant's suffixes -> the environment its process runs with
EXTRAS = {
    "kernels": lambda args: {"LAZYXLA_TPU_KERNELS": "on"},  # the TPU's Pallas kernels (the default)
    "rolled": lambda args: {"LAZYXLA_ROLL_MIN": str(args.layers)},  # the layers rolled into loops
    "long64": lambda args: {"XLA_USE_32BIT_LONG": "0"},  # int64 held in 64 bits (a TPU's default: 32)
}


def config(args):
    if args.model == "llama":
        return llama_config(args)
    from transformers import GPT2Config
    if args.tiny:
        return GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64, resid_pdrop=0.0,
                          embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa")
    return GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=args.width // 64, vocab_size=50257,
                      n_positions=max(1024, args.seq), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      attn_implementation="sdpa")


def llama_config(args):
    """A Llama-style decoder of GPT-2 124M's size (``--model llama``): RMSNorm, rotary embeddings,
    a gated SiLU MLP (8/3 of the width, rounded to 256), a third as many key/value heads as query
    heads, vocabulary 32000, untied embeddings."""
    from transformers import LlamaConfig
    width, layers, heads = (64, 2, 4) if args.tiny else (args.width, args.layers, args.width // 64)
    return LlamaConfig(hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=max(1, heads // 3), intermediate_size=(8 * width // 3 + 255) // 256 * 256,
                       vocab_size=512 if args.tiny else 32000, max_position_embeddings=max(1024, args.seq),
                       attention_dropout=0.0, tie_word_embeddings=False, attn_implementation="sdpa")


def hf_model(args):
    import torch
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config(args))


def _shape(cfg):
    """(layers, width) of a GPT-2 or a Llama config."""
    return (getattr(cfg, "n_layer", None) or cfg.num_hidden_layers, getattr(cfg, "n_embd", None) or cfg.hidden_size)


def batch(args, vocab):
    import torch
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (args.batch, args.seq), generator=g)


def flops_per_step(n_params, cfg, tokens, seq):
    return 6 * n_params * tokens + 12 * cfg.n_layer * cfg.n_embd * seq * tokens


def peak_memory():
    import jax
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use"), stats.get("bytes_limit")


def peak_estimate(row):
    """The step's peak device memory: what the process held at most between programs
    (``memory_stats()``' peak: parameters, optimizer state, gradients, the batch) plus the
    program's temporaries (``memory_analysis()``), which that peak does not count on a TPU (JAX's
    step: 854 MB held, 7.0 GB of temporaries, and batch 16 still fits in 15.7 GB)."""
    temp = (row.get("program") or {}).get("temp_size")
    return None if row.get("peak_bytes") is None or temp is None else row["peak_bytes"] + temp


def analysis(compiled):
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - a backend without it
        return None
    if m is None:
        return None
    return {k: getattr(m, k + "_in_bytes", None) for k in ("argument_size", "output_size", "temp_size",
                                                           "alias_size", "generated_code_size")}


def write_text(folder, compiled):
    """The compiled JAX step's optimized HLO beside its trace, where lazyxla's profiler writes its
    programs' (``lazyxla_programs/<module>.hlo.txt``): the fusions the profile names, to read."""
    text = compiled.as_text()
    name = text.split(None, 2)[1].rstrip(",") if text.startswith("HloModule ") else "jax_step"
    os.makedirs(os.path.join(folder, "lazyxla_programs"), exist_ok=True)
    with open(os.path.join(folder, "lazyxla_programs", name + ".hlo.txt"), "w") as f:
        f.write(text)


def timed_rounds(run_steps, steps, repeats):
    rounds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run_steps(steps)
        rounds.append((time.perf_counter() - t0) / steps * 1e3)
    return statistics.median(rounds), rounds


# ---------------------------------------------------------------------------------------
# The JAX step: GPT-2 written in JAX.
class GPT2:
    """GPT-2's forward and loss in JAX, on the HF model's weights (``params``)."""

    def __init__(self, cfg, dtype):
        self.cfg, self.dtype = cfg, dtype

    def params(self, hf):
        import jax.numpy as jnp
        sd = {k: v.detach().float().numpy() for k, v in hf.state_dict().items()}
        dt = self.dtype
        p = lambda k: jnp.asarray(sd[k], dt)  # noqa: E731
        blocks = []
        for i in range(self.cfg.n_layer):
            h = f"transformer.h.{i}."
            blocks.append({n: p(h + n) for n in (
                "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                "mlp.c_proj.weight", "mlp.c_proj.bias")})
        return {"wte": p("transformer.wte.weight"), "wpe": p("transformer.wpe.weight"), "h": blocks,
                "ln_f.weight": p("transformer.ln_f.weight"), "ln_f.bias": p("transformer.ln_f.bias")}

    @staticmethod
    def _ln(x, w, b, eps=1e-5):
        import jax.numpy as jnp
        x32 = x.astype(jnp.float32)
        mu = x32.mean(-1, keepdims=True)
        var = ((x32 - mu) ** 2).mean(-1, keepdims=True)
        return ((x32 - mu) * (var + eps) ** -0.5 * w.astype(jnp.float32) + b.astype(jnp.float32)).astype(x.dtype)

    def loss(self, params, ids):
        import jax
        import jax.numpy as jnp
        cfg = self.cfg
        B, T = ids.shape
        H, D = cfg.n_head, cfg.n_embd
        x = params["wte"][ids] + params["wpe"][:T]
        causal = jnp.tril(jnp.ones((T, T), bool))
        for b in params["h"]:
            h = self._ln(x, b["ln_1.weight"], b["ln_1.bias"])
            qkv = h @ b["attn.c_attn.weight"] + b["attn.c_attn.bias"]
            q, k, v = (t.reshape(B, T, H, D // H).transpose(0, 2, 1, 3) for t in jnp.split(qkv, 3, axis=-1))
            s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(D // H).astype(x.dtype)
            s = jnp.where(causal, s, jnp.finfo(s.dtype).min)
            p = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(x.dtype)
            a = jnp.einsum("bhqk,bhkd->bhqd", p, v).transpose(0, 2, 1, 3).reshape(B, T, D)
            x = x + a @ b["attn.c_proj.weight"] + b["attn.c_proj.bias"]
            h = self._ln(x, b["ln_2.weight"], b["ln_2.bias"])
            m = jax.nn.gelu(h @ b["mlp.c_fc.weight"] + b["mlp.c_fc.bias"], approximate=True)
            x = x + m @ b["mlp.c_proj.weight"] + b["mlp.c_proj.bias"]
        x = self._ln(x, params["ln_f.weight"], params["ln_f.bias"])
        logits = (x @ params["wte"].T).astype(jnp.float32)[:, :-1]
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1).mean()


def run_jax(args):
    import jax
    import jax.numpy as jnp
    import optax
    import torch
    if args.precision:
        jax.config.update("jax_default_matmul_precision", args.precision)
    dtype = jnp.bfloat16 if args.dtype == "bf16" else jnp.float32
    hf = hf_model(args)
    cfg = hf.config
    model = GPT2(cfg, dtype)
    params = model.params(hf)
    n_params = sum(p.numel() for p in hf.parameters())
    ids = jnp.asarray(batch(args, cfg.vocab_size).numpy())
    del hf, torch
    opt = optax.adamw(1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01)
    state = opt.init(params)

    def step(params, state, ids):
        loss, grads = jax.value_and_grad(model.loss)(params, ids)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    jstep = jax.jit(step, donate_argnums=(0, 1))
    t0 = time.perf_counter()
    lowered = jstep.lower(params, state, ids)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    parts = {"trace+lower": t1 - t0, "backend compile": time.perf_counter() - t1}
    params, state, loss = compiled(params, state, ids)
    first_loss = float(loss)
    first_s = time.perf_counter() - t0
    losses = [first_loss]
    holder = [params, state]

    def run_steps(n):
        p, s = holder
        for _ in range(n):
            p, s, loss_ = compiled(p, s, ids)
        jax.block_until_ready(loss_)
        holder[:] = [p, s]
        losses.append(float(loss_))

    run_steps(2)
    ms, rounds = timed_rounds(run_steps, args.steps, args.repeats)
    last_loss = losses[-1]  # after 3 + steps * repeats steps, as lazyxla's
    if args.profile:
        jax.profiler.start_trace(os.path.join(args.profile, "jax"), create_perfetto_trace=True)
        run_steps(3)
        jax.profiler.stop_trace()
        write_text(os.path.join(args.profile, "jax"), compiled)
    peak, limit = peak_memory()
    return {"variant": "jax", "first_s": first_s, "compile_parts": parts, "ms": ms, "rounds": rounds, "losses": [losses[0], last_loss],
            "peak_bytes": peak, "bytes_limit": limit, "program": analysis(compiled), "n_params": n_params,
            "layers": _shape(cfg)[0], "width": _shape(cfg)[1], "platform": jax.devices()[0].platform}


# ---------------------------------------------------------------------------------------
# The lazyxla step: the HF model as a user writes it.
def lazyxla_step(args, replay=False):
    """The HF model on lazyxla's device in ``--dtype``, and its training step as a user writes it
    (``torch.optim.AdamW``, ``capturable`` for a replay; the loss HF's on one batch)."""
    import torch
    import lazyxla
    dev = lazyxla.device()
    model = hf_model(args).to(torch.bfloat16 if args.dtype == "bf16" else torch.float32).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                            capturable=replay)
    ids = batch(args, model.config.vocab_size).to(dev)

    def step():
        opt.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        return loss

    return model, step


# the parts of lazyxla's compiles (torch_xla's metric names): where the first step's seconds go
COMPILE_PARTS = {"trace": "CompileTraceTime", "roll": "CompileRollTime", "lower": "CompileLowerTime",
                 "backend compile": "CompileBackendTime"}


def run_lazyxla(args, replay=False):
    import jax
    import lazyxla
    from lazyxla.compiler.cache import computation_cache
    if args.precision:
        lazyxla.backends.set_mat_mul_precision(args.precision)
    model, step = lazyxla_step(args, replay)
    cfg = model.config
    n_params = sum(p.numel() for p in model.parameters())
    losses = []
    replayed = lazyxla.compile(step, replay=True) if replay else None

    def one():
        if replayed is not None:
            return replayed()
        loss = step()
        lazyxla.sync()
        return loss

    t0 = time.perf_counter()
    first = one()
    lazyxla.wait_device_ops()
    first_s = time.perf_counter() - t0
    losses.append(first)
    last = [first]

    def run_steps(n):
        for _ in range(n):
            last[0] = one()
        lazyxla.wait_device_ops()

    t0 = time.perf_counter()
    run_steps(2)
    second_s = time.perf_counter() - t0
    ms, rounds = timed_rounds(run_steps, args.steps, args.repeats)
    losses.append(last[0])
    if args.profile:
        from lazyxla.debug import profiler  # torch_xla's start_trace / stop_trace: the programs' text beside
        profiler.start_trace(os.path.join(args.profile, (args.label or ("replay" if replay else "lazyxla")).replace("+", "-")))
        run_steps(3)
        profiler.stop_trace()
    peak, limit = peak_memory()
    programs = sorted(computation_cache().values(), key=lambda p: -p.compile_ns)
    import lazyxla.debug.metrics as met
    parts = {name: (met.metric_data(metric) or (0, 0))[1] / 1e9 for name, metric in COMPILE_PARTS.items()}
    return {"variant": "replay" if replay else "lazyxla", "first_s": first_s, "compile_parts": parts,
            "second_s": second_s, "ms": ms, "rounds": rounds,
            "losses": [float(t.detach().float().cpu()) for t in losses], "peak_bytes": peak, "bytes_limit": limit,
            "program": analysis(programs[0].executable) if programs else None, "programs": len(programs),
            "compiles": met.counter_value("UncachedCompile"), "n_params": n_params, "layers": _shape(cfg)[0],
            "width": _shape(cfg)[1], "precision": lazyxla.backends.get_mat_mul_precision(),
            "platform": jax.devices()[0].platform}


# ---------------------------------------------------------------------------------------
def _mb(b):
    return "-" if b is None else f"{b / 2**20:.0f}"


def report(rows, args):
    from types import SimpleNamespace
    by = {r["variant"]: r for r in rows}
    print(f"\n{'Llama-style' if args.model == 'llama' else 'GPT-2'} {rows[0]['layers']} layers x {rows[0]['width']}, "
          f"batch {args.batch} x {args.seq}, "
          f"{args.dtype}, AdamW, {rows[0]['platform']}")
    print(f"{'variant':<24} {'first s':>8} {'ms/step':>9} {'MFU':>6} {'held MB':>8} {'program MB (arg/out/temp)':>26} "
          f"{'peak MB':>8} {'loss first -> last':>22}")
    cfg = SimpleNamespace(n_layer=rows[0]["layers"], n_embd=rows[0]["width"])
    tokens = args.batch * args.seq
    for r in rows:
        flops = flops_per_step(r["n_params"], cfg, tokens, args.seq)
        mfu = flops / (r["ms"] / 1e3) / (args.peak_tflops * 1e12) if r["platform"] == "tpu" else None
        p = r.get("program") or {}
        prog = "/".join(_mb(p.get(k)) for k in ("argument_size", "output_size", "temp_size")) if p else "-"
        r["mfu"], r["peak_estimate"] = mfu, peak_estimate(r)
        print(f"{r['variant']:<24} {r['first_s']:8.1f} {r['ms']:9.1f} {'-' if mfu is None else f'{mfu:.1%}':>6} "
              f"{_mb(r['peak_bytes']):>8} {prog:>26} {_mb(r['peak_estimate']):>8} "
              f"{r['losses'][0]:>10.4f} -> {r['losses'][-1]:.4f}")
    for r in rows:
        if r.get("compile_parts"):
            print(f"{r['variant']:<24} first step: " + ", ".join(f"{k} {v:.1f} s" for k, v in r["compile_parts"].items()))
    for name in by:
        if "jax" in by and name != "jax":
            j, lz = by["jax"], by[name]
            print(f"{name} / jax: step {lz['ms'] / j['ms']:.2f}x, first step {lz['first_s'] / j['first_s']:.2f}x"
                  + (f", peak memory {lz['peak_estimate'] / j['peak_estimate']:.2f}x"
                     if lz["peak_estimate"] and j["peak_estimate"] else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("gpt2", "llama"), default="gpt2",
                    help="llama: a Llama-style decoder of the same size (lazyxla's variants only)")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--dtype", choices=("bf16", "f32"), default="bf16")
    ap.add_argument("--precision", choices=("default", "high", "highest"), default=None)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--peak-tflops", type=float, default=197.0)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--child", choices=VARIANTS, default=None)
    ap.add_argument("--label", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tiny:
        args.batch, args.seq = 2, 32
    if args.child:
        row = run_jax(args) if args.child == "jax" else run_lazyxla(args, replay=args.child == "replay")
        print("RESULT " + json.dumps(row))
        return
    if args.model == "llama" and any(v.split("+")[0] == "jax" for v in args.variants.split(",")):
        sys.exit("--model llama: lazyxla's variants only (the JAX step is GPT-2's); its MFU is compared with GPT-2's")
    rows = []
    argv = [a for a in sys.argv[1:]]
    for v in args.variants.split(","):
        t0 = time.perf_counter()
        base, *extras = v.split("+")
        if base not in VARIANTS or any(e not in EXTRAS for e in extras):
            sys.exit(f"unknown variant {v!r}: one of {', '.join(VARIANTS)}, lazyxla and replay with "
                     f"{', '.join('+' + e for e in EXTRAS)}")
        env = dict(os.environ, LAZYXLA_TPU_KERNELS="off")
        for e in extras:
            env.update(EXTRAS[e](args))
        r = subprocess.run([sys.executable, os.path.abspath(__file__), *argv, "--child", base, "--label", v],
                           capture_output=True, text=True, env=env)
        got = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
        if r.returncode != 0 or not got:
            print(f"{v}: failed (exit {r.returncode}) after {time.perf_counter() - t0:.0f} s\n{r.stderr[-3000:]}",
                  file=sys.stderr)
            continue
        rows.append(dict(json.loads(got[-1][len("RESULT "):]), variant=v))
        print(f"{v}: done in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    if rows:
        report(rows, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    sys.exit(0 if len(rows) == len(args.variants.split(",")) else 1)


if __name__ == "__main__":
    main()
