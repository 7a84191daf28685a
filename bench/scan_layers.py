"""Compile time against depth: a stack of identical LayerNorm-MLP blocks (width 64, batch 32),
AdamW, trained as a Python loop over the layers and with ``lazyxla.scan_layers``.

Each (way, depth) runs in a new process (no persistent cache): seconds of its first two steps
(the first compiles), programs compiled, compile seconds, a warm step's ms, and the loss after
5 steps. torch_xla 2.9's ``scan_layers`` on this machine: 4.4 s at depth 4, 7.1 s at depth 32
(1.6x; ``../shared/reference/dynamic_shapes_facts.md``).

``--jax`` compiles the same step (SGD) in plain JAX with ``lax.scan`` over the layers, the
parameters laid out four ways, to show where XLA:CPU's compile time grows with depth:
``stacked`` (kept stacked between steps), ``stack_in`` (separate, stacked inside the program,
the new ones returned stacked), ``slice_out`` (the same, with one output per layer's parameter:
what a torch optimizer over separate parameters needs) and ``unrolled`` (a Python loop).

``--repeat N`` runs each row N times and reports the run of median first-two seconds (single
runs vary by 10-20% on this machine).

Usage: python bench/scan_layers.py [--depths 4,32] [--repeat 1] [--job WAY,DEPTH] [--jax]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def job(way, depth):
    import torch
    import torch.nn as nn
    import lazyxla
    import lazyxla.debug.metrics as met

    dev = lazyxla.device()
    torch.manual_seed(0)
    layers = nn.ModuleList([nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
                            for _ in range(depth)]).to(dev)
    opt = torch.optim.AdamW(layers.parameters(), lr=1e-3)
    x = torch.randn(32, 64).to(dev)

    def step():
        if way == "scan_layers":
            h = lazyxla.scan_layers(layers, x)
        else:
            h = x
            for layer in layers:
                h = layer(h)
        loss = h.pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        lazyxla.sync()
        return loss

    t0 = time.perf_counter()
    for _ in range(2):
        loss = step()
    float(loss)
    first_two = time.perf_counter() - t0
    for _ in range(2):
        step()
    lazyxla.wait_device_ops()
    t1 = time.perf_counter()
    loss = step()
    lazyxla.wait_device_ops()
    warm = time.perf_counter() - t1
    d = met.metric_data("CompileTime")
    print(json.dumps({"first_two": first_two, "compiles": met.counter_value("UncachedCompile") or 0,
                      "compile_s": (d[1] / 1e9) if d else 0.0, "warm_ms": warm * 1e3, "loss": float(loss)}))


def jax_job(layout, depth):
    import jax
    import jax.numpy as jnp

    shapes = [(64,), (64,), (256, 64), (256,), (64, 256), (64,)]
    per_layer = [[jnp.full(sh, 0.01) for sh in shapes] for _ in range(depth)]
    x = jnp.ones((32, 64))

    def block(p, h):
        g, b, w1, b1, w2, b2 = p
        mu = h.mean(-1, keepdims=True)
        z = (h - mu) / jnp.sqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b
        return jax.nn.gelu(z @ w1.T + b1, approximate=False) @ w2.T + b2

    def loss_scanned(stacks):
        h, _ = jax.lax.scan(lambda h, p: (block(p, h), None), x, stacks)
        return (h ** 2).mean()

    def sgd(ps, gs):
        return [p - 1e-3 * g for p, g in zip(ps, gs)]

    def stack(layers):
        return [jnp.stack([lay[j] for lay in layers]) for j in range(len(shapes))]

    if layout == "stacked":
        step, arg = (lambda st: sgd(st, jax.grad(loss_scanned)(st))), stack(per_layer)
    elif layout == "stack_in":
        step, arg = (lambda ls: sgd(stack(ls), jax.grad(loss_scanned)(stack(ls)))), per_layer
    elif layout == "slice_out":
        def step(ls):
            new = sgd(stack(ls), jax.grad(loss_scanned)(stack(ls)))
            return [[n[i] for n in new] for i in range(depth)]
        arg = per_layer
    else:
        def loss_unrolled(ls):
            h = x
            for p in ls:
                h = block(p, h)
            return (h ** 2).mean()
        step, arg = (lambda ls: [sgd(p, g) for p, g in zip(ls, jax.grad(loss_unrolled)(ls))]), per_layer
    t0 = time.perf_counter()
    lowered = jax.jit(step).trace(arg).lower()
    t1 = time.perf_counter()
    lowered.compile()
    print(json.dumps({"lower_s": t1 - t0, "compile_s": time.perf_counter() - t1}))


def jax_table(depths):
    print(f"{'layout':<10} " + " ".join(f"{'d' + str(d) + ' compile s':>14}" for d in depths))
    for layout in ("stacked", "stack_in", "slice_out", "unrolled"):
        got = []
        for depth in depths:
            r = subprocess.run([sys.executable, __file__, "--job", f"jax-{layout},{depth}"], capture_output=True,
                               text=True, check=True)
            got.append(json.loads(r.stdout.strip().splitlines()[-1])["compile_s"])
        print(f"{layout:<10} " + " ".join(f"{g:>14.2f}" for g in got))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", default="4,32")
    p.add_argument("--job")
    p.add_argument("--jax", action="store_true", help="plain JAX's compile seconds by parameter layout")
    p.add_argument("--repeat", type=int, default=1, help="runs per row; the median's run is shown")
    a = p.parse_args()
    if a.job:
        way, depth = a.job.split(",")
        if way.startswith("jax-"):
            return jax_job(way[4:], int(depth))
        return job(way, int(depth))
    depths = [int(d) for d in a.depths.split(",")]
    if a.jax:
        return jax_table(depths)
    rows = {}
    print(f"{'way':<12} {'depth':>5} {'first 2 s':>9} {'compiles':>8} {'compile s':>9} {'warm ms':>8} {'loss':>10}")
    for way in ("loop", "scan_layers"):
        for depth in depths:
            runs = []
            for _ in range(max(1, a.repeat)):
                r = subprocess.run([sys.executable, __file__, "--job", f"{way},{depth}"], capture_output=True,
                                   text=True, check=True)
                runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
            runs.sort(key=lambda g: g["first_two"])
            got = rows[way, depth] = runs[len(runs) // 2]
            print(f"{way:<12} {depth:>5} {got['first_two']:>9.2f} {got['compiles']:>8} {got['compile_s']:>9.2f} "
                  f"{got['warm_ms']:>8.1f} {got['loss']:>10.6f}")
    lo, hi = depths[0], depths[-1]
    for way in ("loop", "scan_layers"):
        print(f"{way}: first two steps at depth {hi} / depth {lo}: "
              f"{rows[way, hi]['first_two'] / rows[way, lo]['first_two']:.2f}x")


if __name__ == "__main__":
    main()
