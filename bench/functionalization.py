"""Warm-path cost of keeping PyTorch's view and in-place semantics, per op.

A chain of views and in-place updates through them (``x[1:].add_(c)``, ``x * c``,
``x.relu_()``) on a 128x512 tensor, run three ways in this one run:

- ``bare``: a ``__torch_dispatch__`` subclass that records nothing and tracks no aliases (the
  cost before any functionalization: its in-place results are simply dropped);
- ``torch functionalize``: the same bare subclass under PyTorch's own functionalization
  (``torch.func.functionalize``, C++ FunctionalTensorWrapper), which turns views and in-place
  ops into functional ones before they reach the subclass, still recording nothing;
- ``lazyxla``: lazyxla's storages and view chains, which functionalize *and* record the IR
  (a sync between repeats keeps the graph small; it is not timed).

Usage: python bench/functionalization.py [--ops N] [--repeats R]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.func import functionalize

from bare import Bare


def chain(x, n):
    for _ in range(n // 4):
        x[1:].add_(0.5)  # a view, and an in-place update through it
        x = x * 1.5
        x.relu_()
    return x


def per_op_us(run, n, after=None):
    t0 = time.perf_counter()
    y = run()
    dt = time.perf_counter() - t0
    del y
    if after is not None:
        after()
    return dt / n * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    import lazyxla
    n = args.ops
    bare = Bare((128, 512), torch.float32)
    lz = torch.randn(128, 512).to(lazyxla.device())
    functional = functionalize(lambda t: chain(t, n))
    runs = {
        "bare": (lambda: chain(bare, n), None),
        "torch functionalize": (lambda: functional(bare), None),
        "lazyxla": (lambda: chain(lz, n), lazyxla.sync),
    }
    for run, after in runs.values():  # warm every signature cache
        per_op_us(run, n, after)
    res = {k: [] for k in runs}
    for _ in range(args.repeats):  # interleaved, so drift hits all three alike
        for k, (run, after) in runs.items():
            res[k].append(per_op_us(run, n, after))
    med = {k: statistics.median(v) for k, v in res.items()}
    for k, v in med.items():
        print(f"{k:20s} {v:6.2f} us/op  (runs: {', '.join(f'{x:.2f}' for x in res[k])})")
    print(f"ratio torch functionalize/bare = {med['torch functionalize'] / med['bare']:.2f}")
    print(f"ratio lazyxla/bare             = {med['lazyxla'] / med['bare']:.2f}  (functionalizes and records)")


if __name__ == "__main__":
    main()
