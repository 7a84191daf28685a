"""lazyxla's training step compiled for a TPU v5e on a machine without one: the program XLA's TPU
compiler makes of it, to read before spending chip time.

libtpu (``pip install libtpu``: the registry's wheel) has a compile-only client: JAX compiles for
a TPU topology (``jax.experimental.topologies``, here ``v5e:1x1``) without a chip. This script
builds ``bench/tpu.py``'s model and step (``--model``, ``--layers``, ``--batch``, ``--seq``,
``--dtype``, ``--replay``, ``--kernels``), lets lazyxla record and lower the step as usual, and
compiles the step's program for the TPU instead of this machine, then writes under ``OUT``:
``before.txt`` (the program as lowered), ``after.txt`` (after XLA's TPU passes: the fusions,
layouts and copies a profile on the chip names), ``summary.json`` (compile seconds, the
program's ``memory_analysis``, the sum of XLA's ``estimated_cycles`` by part of the model).

The estimates are XLA's cost model, not a measurement: on the chip they tracked the device time
roughly (GPT-2 124M, B8 x T1024: JAX's step 175M cycles for 80.3 ms, lazyxla's 221M for 92.2 ms,
then 180M for 79.1 ms), well enough to see a fusion that recomputes or a copy that should not
be there. Pallas kernels' time is not estimated. Compare two trees, or two settings, then
measure the better one with ``bench/tpu.py`` on the chip.

Usage: python bench/tpu_aot.py OUT [--replay] [--kernels] [--layers 12] [--model gpt2|llama] [--xla-option NAME=VALUE]
Needs libtpu and transformers; runs on a CPU (2 cores: GPT-2 124M compiles in 1.5-2.5 min).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# libtpu reads these when it loads; on a machine without a TPU they say which one to compile for
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-1")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
# int64 as a TPU holds it (``lazyxla.xla.widths``): in 32 bits
os.environ.setdefault("XLA_USE_32BIT_LONG", "1")


def _part(text):
    """Which part of a GPT-2-like model an instruction (with its fused computation) belongs to,
    by the shapes it touches."""
    if re.search(r"\[\d+,\d+,\d+,\d+\]", text) and re.search(r"(\d{3,}),\1\]", text):
        return "attention"
    if re.search(r"\b(50257|32000)\b", text):
        return "lm head and loss"
    if "convolution(" in text or " dot(" in text:
        return "matrix products (+ fused)"
    return "other"


def xla_options(pairs) -> dict:
    """``NAME=VALUE`` pairs as XLA's compile options take them: true/false as bools, whole
    numbers as ints, the rest as text."""
    def value(v):
        return {"true": True, "false": False}.get(v.lower(), int(v) if v.lstrip("-").isdigit() else v)
    return {name: value(v) for name, v in (p.split("=", 1) for p in pairs)}


def _trips(condition) -> int:
    """A counted loop's trip count: the constant its condition compares the counter with
    (``fori_loop(0, n, ...)``)."""
    found = [int(c) for line in condition for c in re.findall(r"[su]32\[\](?:\{[^}]*\})? constant\((\d+)\)", line)]
    return max(found) if found else 1


def _cycles(comps, name) -> int:
    """A computation's estimated cycles: its instructions', a loop inside it counted per trip."""
    total = 0
    for line in comps.get(name, []):
        loop = re.search(r"condition=%([\w.\-]+), body=%([\w.\-]+)", line)
        if loop is not None and " while(" in line:
            total += _trips(comps[loop[1]]) * _cycles(comps, loop[2])
        else:
            m = re.search(r"\"estimated_cycles\":\"(\d+)\"", line)
            total += int(m[1]) if m else 0
    return total


def estimates(after: str) -> dict:
    """Sum of ``estimated_cycles`` of the entry computation's instructions, by part (a rolled
    loop: its body's instructions times its trips), and the top instructions."""
    comps, cur = {}, None
    for line in after.splitlines():
        if line and not line.startswith((" ", '"', "}")) and line.rstrip().endswith("{"):
            cur = (line.split()[1] if line.startswith("ENTRY") else line.split()[0]).lstrip("%")
            comps[cur] = []
        elif cur is not None:
            comps[cur].append(line)
    entry = next(k for k in comps if "ENTRY %" + k in after)
    parts, top = collections.Counter(), []
    for line in comps[entry]:
        loop = re.search(r"condition=%([\w.\-]+), body=%([\w.\-]+)", line)
        if loop is not None and " while(" in line:  # a rolled loop: its body's cycles times its trips
            cycles = _trips(comps[loop[1]]) * _cycles(comps, loop[2])
            parts["rolled loops (body x trips)"] += cycles
            top.append((cycles, line.split("=")[0].strip().lstrip("%"), "rolled loop"))
            continue
        m = re.match(r"\s*(?:ROOT )?%(\S+) = .*?\"estimated_cycles\":\"(\d+)\"", line)
        if not m:
            continue
        body = line + "\n" + "\n".join("\n".join(comps.get(c, [])) for c in re.findall(r"calls=%([\w.\-]+)", line))
        parts[_part(body)] += int(m[2])
        op = re.search(r'op_name="[^"]*?/([^"/]*(?: at [^"/]*)?)', line)
        top.append((int(m[2]), m[1], op[1] if op else ""))
    return {"cycles": sum(parts.values()), "by_part": dict(parts.most_common()),
            "top": [{"op": n, "cycles": c, "op_name": o} for c, n, o in sorted(top, reverse=True)[:15]]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--model", choices=("gpt2", "llama"), default="gpt2")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--dtype", choices=("bf16", "f32"), default="bf16")
    ap.add_argument("--replay", action="store_true", help="the step captured for replay (as bench/tpu.py's replay)")
    ap.add_argument("--kernels", action="store_true", help="the TPU's Pallas kernels in place of their lowerings")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--xla-option", action="append", default=[], metavar="NAME=VALUE",
                    help="an XLA option for this compile (compiler_options), e.g. xla_allow_excess_precision=false")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    import jax
    from jax.experimental import topologies
    tpu = jax.sharding.SingleDeviceSharding(topologies.get_topology_desc(topology_name="v5e:1x1",
                                                                         platform="tpu").devices[0])
    import lazyxla
    import lazyxla.compiler.compile as compile_mod
    import lazyxla.lowering.tpu_kernels as tpu_kernels
    from lazyxla.xla import precision
    from lazyxla.xla.jax_internals import tupled_parameters
    from tpu import lazyxla_step

    if args.kernels:  # what LAZYXLA_TPU_KERNELS=on does on a TPU
        tpu_kernels._active = lambda: True
    from lazyxla.lowering import program
    program.platform = lambda: "tpu"  # what lowering does for a TPU (lowering.rolled.STACK_BUFFERS)

    def for_the_tpu(graph, key_hex, name, donors=(), wrap_allowed=True):
        fn, specs, _, ws, _ = compile_mod._function(graph, f"{name}_{key_hex[:12]}")
        specs = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=tpu), specs)
        t0 = time.perf_counter()
        with tupled_parameters(wrap_allowed and len(specs) >= compile_mod.WRAP_THRESHOLD), precision.scope():
            donate = tuple(donors) + tuple(range(len(graph.params), len(graph.params) + len(ws)))
            lowered, _ = compile_mod._trace_and_lower(jax.jit(fn, donate_argnums=donate), specs, graph,
                                                      lowering_platforms=("tpu",))
            compiled = lowered.compile(xla_options(args.xla_option) or None)
        seconds = time.perf_counter() - t0
        after = compiled.as_text()
        with open(os.path.join(args.out, "before.txt"), "w") as f:
            f.write(lowered.as_text(dialect="hlo"))
        with open(os.path.join(args.out, "after.txt"), "w") as f:
            f.write(after)
        m = compiled.memory_analysis()
        summary = {"key": key_hex, "compile_s": seconds,
                   "memory": {k: getattr(m, k + "_in_bytes") for k in ("argument_size", "output_size", "temp_size",
                                                                       "alias_size")},
                   **estimates(after)}
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        print(f"compiled for a TPU v5e in {seconds:.0f} s; temporaries {m.temp_size_in_bytes / 2**30:.2f} GiB; "
              f"estimated {summary['cycles'] / 1e6:.1f}M cycles")
        for part, c in summary["by_part"].items():
            print(f"  {part:28s} {c / 1e6:8.2f}M")
        for t in summary["top"][:8]:
            print(f"    {t['op']:32s} {t['cycles'] / 1e6:7.2f}M  {t['op_name']}")
        os._exit(0)  # the step's first program is the one to read; nothing runs on this machine

    compile_mod.compile_graph = for_the_tpu
    for mod in list(sys.modules.values()):  # modules that imported the name
        if getattr(mod, "__name__", "").startswith("lazyxla") and getattr(mod, "compile_graph", None) is not None:
            mod.compile_graph = for_the_tpu
    if args.tiny:
        args.batch, args.seq = 2, 32
    _, step = lazyxla_step(args, args.replay)

    if args.replay:
        lazyxla.compile(step, replay=True)()
    else:
        step()
        lazyxla.sync()
    sys.exit("no program was compiled")


if __name__ == "__main__":
    main()
