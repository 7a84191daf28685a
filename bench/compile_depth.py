"""Where a compile's time goes, by depth: HF GPT-2 (or ``--model bert``, ``llama``) from a
config (width 128, batch 4 x 64 tokens; ``--size small``: vocabulary 64, batch 2 x 16), AdamW, two training steps (the first makes the optimizer's state: one program since
``optimizer_state``, two with ``LAZYXLA_OPTIMIZER_STATE_AS_DATA=0``), each depth in a new
process without a persistent cache.

Per depth: programs compiled and their seconds, split as lazyxla's metrics split them:
``CompileRollTime`` (repeated layers found and rolled, ``rolling``), ``CompileTraceTime`` (the program function traced: lazyxla's lowerings run as JAX traces them),
``CompileLowerTime`` (JAX emits MLIR) and ``CompileBackendTime`` (XLA), that split again from
XLA:CPU's own timing lines (``TF_CPP_VMODULE=cpu_compiler=1``) into its HLO passes and its code
generation (LLVM, which compiles each distinct kernel once: identical kernels cost nothing more,
so code generation grows with the kinds of kernels, the passes with their number), the
slowest kernel's seconds (``kernel s``: kernels compile in parallel, so on a machine of many
cores a compile waits for its slowest one); the largest program's share of the run's compile seconds (issue 33 asks for one
program before the steady state: a share near 1).

``--flags`` runs each depth once per ``XLA_FLAGS`` value (``;`` between values, an empty value
is XLA's defaults) and adds a warm step's ms, so an option that shortens XLA:CPU's compile is
seen beside what it does to the step.

``--roll`` runs each depth unrolled and rolled (``lazyxla.rolling``: the repeated layers as loops).

``--repeats N`` runs the whole sweep N times, one round after the other (so a slow minute of a
shared machine falls on every depth alike), prints every run, then the median compile seconds
per depth and variant and the deepest depth's median over the shallowest's: the ratio issue 51
bounds (depth 32 <= 2x depth 2).

Usage: python bench/compile_depth.py [--depths 2,8,32] [--flags ";--xla_backend_optimization_level=0"] [--roll] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# --size: (width, heads, vocabulary, batch, tokens). "small" is a model whose tensors are so small
# that a compile's time is its number of ops and kernels, not their sizes (issue 51: rolled, its
# depth 32 compiled in 4x depth 2's time where the default size took 1.5-1.7x).
SIZES = {"default": (128, 4, 512, 4, 64), "small": (128, 4, 64, 2, 16)}


def build(model, depth, size="default"):
    """An HF model from a config: ``depth`` layers of ``SIZES[size]``."""
    import transformers as tf
    width, heads, vocab, _, tokens = SIZES[size]
    if model == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=vocab, n_positions=tokens, n_embd=width, n_layer=depth,
                                                n_head=heads))
    if model == "bert":
        return tf.BertForMaskedLM(tf.BertConfig(vocab_size=vocab, hidden_size=width, num_hidden_layers=depth,
                                                num_attention_heads=heads, intermediate_size=4 * width,
                                                max_position_embeddings=tokens))
    if model == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=vocab, hidden_size=width, num_hidden_layers=depth,
                                                  num_attention_heads=heads, num_key_value_heads=heads,
                                                  intermediate_size=2 * width, max_position_embeddings=tokens))
    raise SystemExit(f"unknown model {model!r}: gpt2, bert or llama")


def job(depth, model_name, size="default"):
    import torch
    import lazyxla
    import lazyxla.debug.metrics as met

    dev = lazyxla.device()
    torch.manual_seed(0)
    model = build(model_name, depth, size).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    _, _, vocab, batch, tokens = SIZES[size]
    ids = torch.randint(0, vocab, (batch, tokens)).to(dev)
    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        lazyxla.sync()
        return loss

    for _ in range(2):
        loss = step()
    float(loss)
    lazyxla.wait_device_ops()
    t0 = time.perf_counter()
    for _ in range(3):
        step()
    lazyxla.wait_device_ops()
    warm_ms = (time.perf_counter() - t0) / 3 * 1e3

    def secs(name):
        d = met.metric_data(name)
        return (d[1] / 1e9, [v / 1e9 for _, v in d[2]]) if d else (0.0, [])

    total, each = secs("CompileTime")
    print(json.dumps({"compiles": met.counter_value("UncachedCompile") or 0, "total": total,
                      "largest": max(each) if each else 0.0, "trace": secs("CompileTraceTime")[0],
                      "lower": secs("CompileLowerTime")[0], "backend": secs("CompileBackendTime")[0],
                      "roll": secs("CompileRollTime")[0],
                      "warm_ms": warm_ms}))


def xla_split(log):
    """(HLO passes s, code generation s) summed over the programs in XLA:CPU's timing lines."""
    def total(what):
        secs = 0.0
        for v, unit in re.findall(what + r"[^\n]* time: ([\d.]+) (us|ms|s) ", log):
            secs += float(v) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]
        return secs
    return total(r"Running HLO passes on \[jit_SyncTensorsGraph\w*\]"), total(r"Compiling \[jit_SyncTensorsGraph\w*\]")


def longest_kernel(log):
    """The seconds of the slowest kernel LLVM compiled (XLA:CPU compiles a program's kernels in
    parallel: on a machine with many cores, a compile waits for its slowest one)."""
    secs = [float(v) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]
            for v, unit in re.findall(r"Compiled LLVM module: \S+ time: ([\d.]+) (us|ms|s) ", log)]
    return max(secs, default=0.0)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", default="2,8,32")
    p.add_argument("--job", type=int)
    p.add_argument("--model", default="gpt2", help="gpt2, bert or llama (HF, from a config)")
    p.add_argument("--size", default="default", choices=sorted(SIZES),
                   help="default: width 128, 4 heads, vocabulary 512, batch 4 x 64 tokens; small: vocabulary 64, "
                        "batch 2 x 16 (a compile's time is its ops, not their sizes)")
    p.add_argument("--flags", default=None, help="XLA_FLAGS values to compare, ';' between them")
    p.add_argument("--roll", action="store_true",
                   help="each depth unrolled and with its repeated layers rolled (LAZYXLA_ROLL_LAYERS=0 / 1, "
                        "LAZYXLA_ROLL_MIN=4)")
    p.add_argument("--repeats", type=int, default=1, help="rounds of the whole sweep; medians and the depth ratio after")
    a = p.parse_args()
    if a.job:
        return job(a.job, a.model, a.size)
    variants = a.flags.split(";") if a.flags is not None else [None]
    rolls = ["0", "1"] if a.roll else [None]
    print(f"{'depth':>5} {'compiles':>8} {'compile s':>9} {'roll s':>6} {'trace s':>8} {'MLIR s':>7} {'XLA s':>7} "
          f"{'passes s':>8} {'codegen s':>9} {'kernel s':>8} {'largest/all':>11} {'warm ms':>8}" + ("  XLA_FLAGS" if a.flags is not None else "")
          + ("  rolled" if a.roll else ""))
    depths = [int(d) for d in a.depths.split(",")]
    runs = {}  # (flags, roll) -> depth -> [compile s, ...]
    for depth in (d for _ in range(a.repeats) for d in depths):
        for flags, roll in ((f, r) for f in variants for r in rolls):
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="cpu_compiler=1,ir_compiler=2")
            if flags is not None:
                env["XLA_FLAGS"] = flags
            if roll is not None:
                env.update(LAZYXLA_ROLL_LAYERS=roll, LAZYXLA_ROLL_MIN="4")
            r = subprocess.run([sys.executable, __file__, "--job", str(depth), "--model", a.model, "--size", a.size], capture_output=True, text=True,
                               check=True, env=env)
            g = json.loads(r.stdout.strip().splitlines()[-1])
            passes, codegen = xla_split(r.stderr)
            runs.setdefault((flags, roll), {}).setdefault(depth, []).append(g["total"])
            print(f"{depth:>5} {g['compiles']:>8} {g['total']:>9.2f} {g['roll']:>6.2f} {g['trace']:>8.2f} {g['lower']:>7.2f} "
                  f"{g['backend']:>7.2f} {passes:>8.2f} {codegen:>9.2f} {longest_kernel(r.stderr):>8.2f} {g['largest'] / g['total'] if g['total'] else 0:>11.2f} "
                  f"{g['warm_ms']:>8.1f}" + (f"  {flags or '(defaults)'}" if flags is not None else "")
                  + (f"  {'yes' if roll == '1' else 'no'}" if roll is not None else ""))
    if a.repeats > 1:
        print(f"\nmedians of {a.repeats} runs (compile s):")
        for (flags, roll), by_depth in runs.items():
            med = {d: statistics.median(v) for d, v in by_depth.items()}
            label = ((f"XLA_FLAGS {flags or '(defaults)'} " if flags is not None else "")
                     + ({"0": "unrolled", "1": "rolled"}.get(roll, "")))
            print(f"  {label or 'defaults':<24} " + "  ".join(f"depth {d}: {med[d]:.2f}" for d in depths)
                  + f"  depth {depths[-1]} / depth {depths[0]}: {med[depths[-1]] / med[depths[0]]:.2f}x")


if __name__ == "__main__":
    main()
