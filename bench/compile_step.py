"""The torch.compile path against jax.jit, eager and the lazy path: the MLP step of step.py.

MLP 784-512-512-10, batch 128, SGD with momentum 0.9, cross-entropy, one ``lazyxla.sync()``
per step. Two ways to compile it:
(a) ``torch.compile(model, backend="lazyxla")``: the forward compiled (its backward too, by
    AOTAutograd), ``loss.backward()`` and ``opt.step()`` called as usual;
(b) the whole step compiled: ``torch.compile(train_step, backend="lazyxla")`` over
    ``zero_grad``, forward, ``backward()`` and ``opt.step()``;
(c) as (b), with ``torch._dynamo.config.trace_autograd_ops = True``: Dynamo traces
    ``backward()`` into the step's graph, so forward and backward are one region.
Prints ms per step for each, jax.jit (the same step, with donation), eager and the lazy path,
all in this one run, the ratios to jax.jit, where a warm step of (c) goes (PyTorch's own
machinery, lazyxla's region calls and sync, JAX's dispatch, the program), and the first call's
latency (trace + compile) against the lazy path's first step. Issue 11's target: the better of (a)/(b) <= 1.10x jax.jit.
Usage: python bench/compile_step.py [--steps N] [--repeats R]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from step import bench_eager, bench_jax, setup, time_loop, timed, train_step


def _lazy_setup():
    import lazyxla
    return lazyxla, setup(lazyxla.device())


def bench_lazy(n):
    lazyxla, state = _lazy_setup()

    def step():
        train_step(*state)
        lazyxla.sync()
    return time_loop(step, n, lazyxla.wait_device_ops)


def bench_compiled_model(n):
    lazyxla, (model, opt, x, y) = _lazy_setup()
    cmodel = torch.compile(model, backend="lazyxla")

    def step():
        train_step(cmodel, opt, x, y)
        lazyxla.sync()
    return time_loop(step, n, lazyxla.wait_device_ops)


def _compiled_step(model, opt):
    """The whole step, compiled: (b), or (c) under ``trace_autograd_ops``."""
    @torch.compile(backend="lazyxla")
    def step_fn(x, y):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return step_fn


def bench_compiled_step(n):
    lazyxla, (model, opt, x, y) = _lazy_setup()
    step_fn = _compiled_step(model, opt)

    def step():
        step_fn(x, y)
        lazyxla.sync()
    return time_loop(step, n, lazyxla.wait_device_ops)


def bench_compiled_step_traced_backward(n):
    """(c): (b) with Dynamo tracing backward() into the step's graph (``trace_autograd_ops``):
    forward and backward one region, the optimizer step the other."""
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        torch._dynamo.reset()
        return bench_compiled_step(n)


def host_breakdown(n=200):
    """Where a warm step of (c) goes, each phase waited for before the next (no overlap): the
    compiled function's call, split into lazyxla's region calls and PyTorch's own machinery
    around them (Dynamo's frames and guards, AOTAutograd's wrappers, the optimizer's Python),
    then ``sync()`` (of which JAX's call of the program), then the program still running."""
    import lazyxla
    from lazyxla.regions import region as capture
    from lazyxla.run import execution
    spent = {"region": 0.0, "jax call": 0.0}

    region_call, jax_run = capture.Region.__call__, execution.run
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        torch._dynamo.reset()
        _, (model, opt, x, y) = _lazy_setup()
        step_fn = _compiled_step(model, opt)
        for _ in range(5):
            step_fn(x, y)
            lazyxla.sync()
        lazyxla.wait_device_ops()
        capture.Region.__call__ = timed(spent, "region", region_call)
        import lazyxla.engine.executor as executor
        executor.run = timed(spent, "jax call", jax_run)
        try:
            rows = []
            for _ in range(n):
                spent.update({"region": 0.0, "jax call": 0.0})
                t0 = time.perf_counter()
                step_fn(x, y)
                t1 = time.perf_counter()
                lazyxla.sync()
                t2 = time.perf_counter()
                lazyxla.wait_device_ops()
                t3 = time.perf_counter()
                rows.append((t1 - t0 - spent["region"], spent["region"], t2 - t1 - spent["jax call"],
                             spent["jax call"], t3 - t2))
        finally:
            capture.Region.__call__ = region_call
            executor.run = jax_run
    names = ("PyTorch (Dynamo, AOT, optimizer)", "lazyxla region calls", "lazyxla sync", "dispatch (JAX's call of the program)",
             "program still running")
    return {k: statistics.median(r[i] for r in rows) * 1e3 for i, k in enumerate(names)}


def first_call(kind):
    """Seconds of the first step (trace + compile + run), from a fresh model and an empty
    in-memory compilation cache."""
    lazyxla, (model, opt, x, y) = _lazy_setup()
    from lazyxla.compiler.cache import computation_cache
    computation_cache().clear()
    torch._dynamo.reset()
    if kind == "compiled":
        model = torch.compile(model, backend="lazyxla")
    t0 = time.perf_counter()
    train_step(model, opt, x, y)
    lazyxla.sync()
    lazyxla.wait_device_ops()
    return time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    fns = {"jax.jit": bench_jax, "(a) compiled model": bench_compiled_model,
           "(b) compiled step": bench_compiled_step, "(c) step, backward traced": bench_compiled_step_traced_backward,
           "lazy path": bench_lazy, "eager": bench_eager}
    results = {k: [] for k in fns}
    for _ in range(args.repeats):  # interleaved, so drift hits all alike
        for k, f in fns.items():
            results[k].append(f(args.steps))
    med = {k: statistics.median(v) for k, v in results.items()}
    for k, v in med.items():
        print(f"{k:26s} {v:7.3f} ms/step  ratio to jax.jit {v / med['jax.jit']:.3f}  "
              f"(runs: {', '.join(f'{x:.3f}' for x in results[k])})")
    best = min(med["(a) compiled model"], med["(b) compiled step"], med["(c) step, backward traced"])
    print(f"best of (a)/(b)/(c) / jax.jit = {best / med['jax.jit']:.3f}  (target <= 1.10)")
    parts = host_breakdown()
    print("where a warm step of (c) goes, phases run one after another (ms): " +
          ", ".join(f"{k} {v:.3f}" for k, v in parts.items()))
    print(f"  PyTorch's own part alone is {parts['PyTorch (Dynamo, AOT, optimizer)'] / med['jax.jit']:.1%} "
          f"of the jax.jit step")
    lazy_first, compiled_first = first_call("lazy"), first_call("compiled")
    print(f"first step: lazy path {lazy_first:.2f} s, compiled model {compiled_first:.2f} s "
          f"(ratio {compiled_first / lazy_first:.2f})")
    import lazyxla.debug.metrics as met
    print(f"lazyxla compiles: UncachedCompile={met.counter_value('UncachedCompile')}, "
          f"CachedCompile={met.counter_value('CachedCompile')}, "
          f"regions captured={met.counter_value('DynamoExtractCompiledGraph')}")


if __name__ == "__main__":
    main()
