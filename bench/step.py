"""Warm training step: lazyxla against the same model written in jax.jit and PyTorch eager.

MLP 784-512-512-10, batch 128, SGD with momentum 0.9, cross-entropy. Prints ms per step for
each system and the ratios, all measured in this one run. ``--explain`` adds a lazyxla run
with LAZYXLA_EXPLAIN_RECOMPILES on and reports that ratio too.
Usage: python bench/step.py [--steps N] [--repeats R] [--explain]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

SIZES = (784, 512, 512, 10)
BATCH = 128


def make_data(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, SIZES[0], generator=g), torch.randint(0, SIZES[-1], (BATCH,), generator=g)


def torch_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(SIZES[0], SIZES[1]), nn.ReLU(), nn.Linear(SIZES[1], SIZES[2]), nn.ReLU(),
                         nn.Linear(SIZES[2], SIZES[3]))


def time_loop(step, n, finish):
    for _ in range(5):
        step()
    finish()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    finish()
    return (time.perf_counter() - t0) / n * 1e3


def bench_eager(n):
    model = torch_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = make_data()

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return time_loop(step, n, lambda: None)


def bench_lazyxla(n):
    import lazyxla
    dev = lazyxla.device()
    model = torch_model().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = make_data()
    x, y = x.to(dev), y.to(dev)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        lazyxla.sync()
    return time_loop(step, n, lazyxla.wait_device_ops)


def bench_lazyxla_explaining(n):
    from lazyxla import explain
    old = explain.EXPLAIN
    explain.EXPLAIN = True  # what LAZYXLA_EXPLAIN_RECOMPILES=1 sets at import
    try:
        return bench_lazyxla(n)
    finally:
        explain.EXPLAIN = old


def bench_jax(n):
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    model = torch_model()
    params = [(jnp.asarray(m.weight.detach().numpy()), jnp.asarray(m.bias.detach().numpy()))
              for m in model if isinstance(m, nn.Linear)]
    mom = jax.tree_util.tree_map(jnp.zeros_like, params)
    x, y = make_data()
    x, y = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())

    def loss_fn(params, x, y):
        h = x
        for i, (w, b) in enumerate(params):
            h = h @ w.T + b
            if i < len(params) - 1:
                h = jax.nn.relu(h)
        logp = jax.nn.log_softmax(h)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    @jax.jit
    def _unused(p):
        return p

    def update(params, mom, x, y):
        g = jax.grad(loss_fn)(params, x, y)
        mom = jax.tree_util.tree_map(lambda m, gg: 0.9 * m + gg, mom, g)
        params = jax.tree_util.tree_map(lambda p, m: p - 0.01 * m, params, mom)
        return params, mom

    update = jax.jit(update, donate_argnums=(0, 1))
    state = [params, mom]

    def step():
        state[0], state[1] = update(state[0], state[1], x, y)
    return time_loop(step, n, lambda: jax.block_until_ready(state))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--explain", action="store_true",
                    help="also run lazyxla with LAZYXLA_EXPLAIN_RECOMPILES on and report that ratio")
    args = ap.parse_args(argv)
    results = {"jax.jit": [], "lazyxla": [], "eager": []}
    fns = {"jax.jit": bench_jax, "lazyxla": bench_lazyxla, "eager": bench_eager}
    if args.explain:
        results["lazyxla+explain"] = []
        fns["lazyxla+explain"] = bench_lazyxla_explaining
    for _ in range(args.repeats):  # interleaved, so drift hits all three alike
        for k, f in fns.items():
            results[k].append(f(args.steps))
    med = {k: statistics.median(v) for k, v in results.items()}
    for k, v in med.items():
        print(f"{k:8s} {v:7.3f} ms/step  (runs: {', '.join(f'{x:.3f}' for x in results[k])})")
    print(f"ratio lazyxla/jax.jit = {med['lazyxla'] / med['jax.jit']:.3f}")
    print(f"ratio lazyxla/eager   = {med['lazyxla'] / med['eager']:.3f}")
    if args.explain:
        print(f"ratio lazyxla with/without LAZYXLA_EXPLAIN_RECOMPILES = "
              f"{med['lazyxla+explain'] / med['lazyxla']:.3f}")
    import lazyxla.debug.metrics as met
    print(f"lazyxla compiles: UncachedCompile={met.counter_value('UncachedCompile')}, "
          f"CachedCompile={met.counter_value('CachedCompile')}")


if __name__ == "__main__":
    main()
