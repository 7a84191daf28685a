"""Where the host bounds the step: a deep, narrow MLP at several depths, every way lazyxla runs it.

Width 64, batch 16, SGD with momentum 0.9, cross-entropy; tensors so small that the device's
work is nothing and a step's time is the host's. For each depth (default 2, 8 and 32 hidden
layers), in this one run, ms per step of:
- jax.jit: the same step written in JAX (donating parameters and momentum), returning the new
  parameters, momentum and the loss;
- jax.jit+grads: the same, also returning every gradient: what PyTorch's step leaves live
  (each ``.grad`` after ``backward()``), so what lazyxla's program must compute and return;
- eager: PyTorch on the CPU;
- lazy: lazyxla's lazy path (record every op, ``lazyxla.sync()``);
- compile-step: ``torch.compile(train_step, backend="lazyxla")``, one sync per step;
- compile-model: ``torch.compile(model, backend="lazyxla")``, backward and step as usual;
- inductor: ``torch.compile(train_step)`` with PyTorch's own compiler on CPU tensors: the same
  Dynamo frames, AOTAutograd, autograd engine and optimizer, around inductor's kernels;
- compile+replay: ``torch.compile(train_step, backend="lazyxla")`` inside
  ``lazyxla.compile(..., replay=True)``: captured once, replayed (no Dynamo, AOTAutograd,
  autograd engine or optimizer Python per call);
- replay: the step captured once with ``lazyxla.graph`` and ``g.replay()`` per step;
- replay-step: ``lazyxla.compile(train_step, replay=True)`` called per step (its checks done);
- replay-no-grads: as replay, the step clearing the gradients at its end instead of its start
  (``opt.zero_grad(set_to_none=True)`` last): no ``.grad`` is left, so its program returns what
  jax.jit's returns.
Then each row's ratio to jax.jit, what it adds per layer (the slope between the smallest and
the largest depth) and its fixed cost (that line at depth 0), each beside jax.jit's, as the
median and as the best of ``--repeats`` interleaved runs (this
machine's speed moves by 2x within minutes), and where a replay's time goes (binding the
buffers, JAX's dispatch, the outputs and the end of the step), and where a torch.compile'd
step's time goes by depth (PyTorch's machinery; lazyxla's region calls, ops recorded one by
one and sync; JAX's call).
Issue 52's targets: replay-step <= 1.3x jax.jit at depth 32 and <= 1.5x at depth 8, its cost
per layer <= 1.5x jax.jit's (``--depths 8,32``). Issue 22's: replay <= 1.5x jax.jit at every depth. A PyTorch step leaves every ``.grad``
live, so its program must return the gradients too: compare replay with jax.jit+grads, and
replay-no-grads with jax.jit. Issue 23's: the compiled step <= 3x jax.jit at the largest depth
and per layer.
Usage: python bench/hostcost.py [--depths 2,8,32] [--steps N] [--repeats R] [--only ROWS]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from step import jax_sgd_step, time_loop

WIDTH, BATCH = 64, 16


def make_model(depth):
    torch.manual_seed(0)
    layers = [nn.Linear(WIDTH, WIDTH)]
    for _ in range(depth - 1):
        layers += [nn.ReLU(), nn.Linear(WIDTH, WIDTH)]
    return nn.Sequential(*layers)


def make_batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randint(0, WIDTH, (BATCH,), generator=g)


def train_step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def train_step_no_grads(model, opt, x, y):
    """The step that leaves no gradients behind (cleared at its end, not its start): its
    program returns what jax.jit's returns."""
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def _opt(model):
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


# -- the rows ---------------------------------------------------------------------------------
def row_jax(depth, n, live_grads=False):
    step, finish = jax_sgd_step(make_model(depth), *make_batch(), live_grads=live_grads)
    return time_loop(step, n, finish)


def row_jax_grads(depth, n):
    return row_jax(depth, n, live_grads=True)


def row_eager(depth, n):
    model = make_model(depth)
    opt = _opt(model)
    x, y = make_batch()
    return time_loop(lambda: train_step(model, opt, x, y), n, lambda: None)


def _lazy_state(depth):
    import lazyxla
    dev = lazyxla.device()
    model = make_model(depth).to(dev)
    x, y = (t.to(dev) for t in make_batch())
    return lazyxla, model, _opt(model), x, y


def _synced(depth, n, compiled=None):
    """ms per step of the step recorded and synced, with torch.compile of the whole step
    (``compiled="step"``) or of the model (``"model"``)."""
    torch._dynamo.reset()  # a new model per run: Dynamo's cache of the last one would hit its limit
    lazyxla, model, opt, x, y = _lazy_state(depth)
    fn = torch.compile(train_step, backend="lazyxla") if compiled == "step" else train_step
    m = torch.compile(model, backend="lazyxla") if compiled == "model" else model

    def step():
        fn(m, opt, x, y)
        lazyxla.sync()
    return time_loop(step, n, lazyxla.wait_device_ops)


def row_lazy(depth, n):
    return _synced(depth, n)


def row_compile_step(depth, n):
    return _synced(depth, n, "step")


def row_compile_model(depth, n):
    return _synced(depth, n, "model")


def row_inductor(depth, n):
    """PyTorch's own compiler on the CPU: ``torch.compile(train_step)`` (inductor) on CPU tensors,
    the same Dynamo frames, AOTAutograd, autograd engine and optimizer around kernels of its own:
    what PyTorch's per-call machinery costs with no lazy device at all. NaN where inductor
    cannot compile (it needs a C++ compiler)."""
    torch._dynamo.reset()
    model = make_model(depth)
    opt = _opt(model)
    x, y = make_batch()
    fn = torch.compile(train_step)
    try:
        return time_loop(lambda: fn(model, opt, x, y), n, lambda: None)
    except Exception:  # noqa: BLE001 - no compiler on this machine: a reference row only
        return float("nan")


def row_compile_replay(depth, n):
    """``torch.compile(train_step)`` inside ``lazyxla.compile(..., replay=True)``: the compiled
    step captured once and replayed, so Dynamo, AOTAutograd, the autograd engine and the
    optimizer's Python run only while capturing."""
    torch._dynamo.reset()
    lazyxla, model, opt, x, y = _lazy_state(depth)
    compiled = torch.compile(train_step, backend="lazyxla")
    step = lazyxla.compile(lambda x, y: compiled(model, opt, x, y), replay=True)
    for _ in range(4):  # lazy, capture, the two checked replays
        step(x, y)
    return time_loop(lambda: step(x, y), n, lazyxla.wait_device_ops)


def _captured(depth, step=train_step):
    lazyxla, model, opt, x, y = _lazy_state(depth)
    step(model, opt, x, y)  # warm up: the momentum buffers appear
    lazyxla.sync()
    g = lazyxla.Graph()
    with lazyxla.graph(g):
        step(model, opt, x, y)
    g.kept = (model, opt, x, y)  # a replay binds these tensors: they must stay alive
    return lazyxla, g


def row_replay(depth, n):
    lazyxla, g = _captured(depth)
    return time_loop(g.replay, n, lazyxla.wait_device_ops)


def row_replay_no_grads(depth, n):
    lazyxla, g = _captured(depth, train_step_no_grads)
    return time_loop(g.replay, n, lazyxla.wait_device_ops)


def row_replay_step(depth, n):
    lazyxla, model, opt, x, y = _lazy_state(depth)
    step = lazyxla.compile(lambda x, y: train_step(model, opt, x, y), replay=True)
    for _ in range(4):  # lazy, capture, the two checked replays
        step(x, y)
    return time_loop(lambda: step(x, y), n, lazyxla.wait_device_ops)


ROWS = {"jax.jit": row_jax, "jax.jit+grads": row_jax_grads, "eager": row_eager, "lazy": row_lazy, "compile-step": row_compile_step,
        "compile-model": row_compile_model, "inductor": row_inductor, "compile+replay": row_compile_replay,
        "replay": row_replay,
        "replay-step": row_replay_step, "replay-no-grads": row_replay_no_grads}


COMPILED_PHASES = (("PyTorch", "PyTorch's own machinery: Dynamo's frames and guards, AOTAutograd's wrappers, "
                                "the autograd engine, the optimizer's and zero_grad's Python"),
                   ("regions", "lazyxla: compiled regions' calls (one IR node each, a tensor per output)"),
                   ("ops", "lazyxla: ops recorded one by one (AccumulateGrad's detach, backward's seed; for the "
                           "compiled model also the optimizer)"),
                   ("sync", "lazyxla: the sync besides JAX's call (collect, post-order, lookup, outputs)"),
                   ("dispatch", "JAX: calling the program (and its output placeholders)"))


def compiled_phases(depth, n, compiled="step"):
    """Where a compiled step's host time goes (ms per step, medians of ``n`` steps, each
    waited for): lazyxla's parts timed where the step enters them (``hosttimers``), PyTorch's
    the rest of the traced step. The timers add about a microsecond per region call and
    recorded op."""
    import hosttimers
    torch._dynamo.reset()
    lazyxla, model, opt, x, y = _lazy_state(depth)
    fn = torch.compile(train_step, backend="lazyxla") if compiled == "step" else train_step
    m = torch.compile(model, backend="lazyxla") if compiled == "model" else model
    rows = []
    with hosttimers.install() as spent:
        for i in range(n + 10):
            hosttimers.reset()
            t0 = time.perf_counter()
            fn(m, opt, x, y)
            t1 = time.perf_counter()
            lazyxla.sync()
            t2 = time.perf_counter()
            lazyxla.wait_device_ops()
            if i >= 10:
                rows.append({"PyTorch": t1 - t0 - spent["regions"] - spent["ops"], "regions": spent["regions"],
                             "ops": spent["ops"], "sync": t2 - t1 - spent["dispatch"], "dispatch": spent["dispatch"],
                             "total": t2 - t0})
    return {k: statistics.median(r[k] for r in rows) * 1e3 for k in rows[0]}


def replay_phases(depth, n):
    """A replay's own parts, each replay waited for (ms, medians): binding, the dispatch
    (execution.run: JAX's call and the completion queue), the outputs and the end of the step."""
    from lazyxla.replay import binding as rp  # where a replay calls execution.run
    lazyxla, g = _captured(depth)
    b = g._binding
    spent = {}
    saved_run, saved_end = rp.run, b._end_step

    def run(*a, **k):
        t = time.perf_counter()
        out = saved_run(*a, **k)
        spent["dispatch"] = time.perf_counter() - t
        spent["t_run_end"] = time.perf_counter()
        return out

    def end():
        t = time.perf_counter()
        spent["outputs"] = t - spent["t_run_end"]
        saved_end()
        spent["end of step"] = time.perf_counter() - t

    rows = []
    rp.run, b._end_step = run, end
    try:
        for i in range(n + 5):
            t0 = time.perf_counter()
            g.replay()
            total = time.perf_counter() - t0
            lazyxla.wait_device_ops()
            if i >= 5:
                rest = total - spent["dispatch"] - spent["outputs"] - spent["end of step"]
                rows.append({"binding and checks": rest, "dispatch": spent["dispatch"], "outputs": spent["outputs"],
                             "end of step": spent["end of step"], "total": total})
    finally:
        rp.run = saved_run
        del b._end_step
    return {k: statistics.median(r[k] for r in rows) * 1e3 for k in rows[0]}


def slope_and_fixed(val, row, lo, hi):
    """A row's cost per layer (the slope between depths ``lo`` and ``hi``, ms) and its fixed cost
    (that line at depth 0: what a step costs besides its layers)."""
    if hi == lo:
        return float("nan"), float("nan")
    slope = (val[(row, hi)] - val[(row, lo)]) / (hi - lo)
    return slope, val[(row, lo)] - slope * lo


def _ratio(a, b):
    return a / b if b else float("nan")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", default="2,8,32")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default=",".join(ROWS))
    args = ap.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",")]
    names = [r for r in args.only.split(",") if r in ROWS]
    if "jax.jit" not in names:
        names.insert(0, "jax.jit")
    times = {(r, d): [] for r in names for d in depths}
    for _ in range(args.repeats):
        for d in depths:
            for r in names:
                times[(r, d)].append(ROWS[r](d, args.steps))
    for how, pick in (("median", statistics.median), ("best", min)):
        val = {k: pick(v) for k, v in times.items()}
        print(f"deep narrow MLP (width {WIDTH}, batch {BATCH}, SGD momentum), ms per step "
              f"({how} of {args.repeats} interleaved runs), x jax.jit in brackets")
        print(f"{'':15}" + "".join(f"{'depth ' + str(d):>20}" for d in depths) + f"{'per layer':>20}"
              f"{'fixed':>20}")
        lo, hi = depths[0], depths[-1]
        jslope, jfixed = slope_and_fixed(val, "jax.jit", lo, hi)
        for r in names:
            cells = "".join(f"{val[(r, d)]:10.3f} ({val[(r, d)] / val[('jax.jit', d)]:5.2f}x)" for d in depths)
            slope, fixed = slope_and_fixed(val, r, lo, hi)
            print(f"{r:15}{cells}{slope:11.4f} ({_ratio(slope, jslope):5.2f}x){fixed:11.3f} ({_ratio(fixed, jfixed):5.2f}x)")
        print()
    for kind in ("step", "model"):
        if f"compile-{kind}" in names:
            print(f"where torch.compile's {kind} step's host time goes (ms per step, each waited for, medians; "
                  f"per layer: the slope between depths {depths[0]} and {depths[-1]}):")
            for name, what in COMPILED_PHASES:
                print(f"  {name:9} {what}")
            ph = {d: compiled_phases(d, args.steps, kind) for d in depths}
            keys = [name for name, _ in COMPILED_PHASES] + ["total"]
            print(f"  {'':9}" + "".join(f"{'depth ' + str(d):>12}" for d in depths) + f"{'per layer':>12}")
            for k in keys:
                slope = (ph[depths[-1]][k] - ph[depths[0]][k]) / (depths[-1] - depths[0]) if len(depths) > 1 else 0.0
                print(f"  {k:9}" + "".join(f"{ph[d][k]:12.3f}" for d in depths) + f"{slope:12.4f}")
            print()
    if "replay" in names:
        print("where a replay's time goes (ms, each replay waited for, medians):")
        for d in depths:
            ph = replay_phases(d, args.steps)
            print(f"  depth {d:3}: " + ", ".join(f"{k} {v:.3f}" for k, v in ph.items()))


if __name__ == "__main__":
    main()
