"""Warm-path tracing cost: microseconds per recorded op, against a bare dispatch subclass.

A chain of small elementwise ops (add, mul, relu, sub, ...) on a 128x512 tensor is recorded
on the lazy device (no sync inside the timed part; the chain is synced between repeats so
the IR does not grow without bound). The baseline is a ``__torch_dispatch__`` wrapper
subclass that records nothing and only builds a new wrapper per op. Both are measured in
this one run, interleaved; the ratio is what counts. The median and the best of the repeats
are both printed: on a shared machine the best is the cost without interference.
Usage: python bench/trace.py [--ops N] [--repeats R]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


class Bare(torch.Tensor):
    @staticmethod
    def __new__(cls, shape, dtype):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device="meta")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        a = args[0]
        return Bare(a.shape, a.dtype)


def chain(x, n):
    for i in range(n // 4):
        x = x + 0.5
        x = x * 1.5
        x = torch.relu(x)
        x = x - 0.25
    return x


def per_op_us(x, n, after=lambda y: None):
    chain(x, 64)  # warm the signature caches
    after(None)
    t0 = time.perf_counter()
    y = chain(x, n)
    dt = time.perf_counter() - t0
    after(y)
    return dt / n * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ops", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    import lazyxla
    dev = lazyxla.device()
    lz = torch.randn(128, 512).to(dev)
    bare = Bare((128, 512), torch.float32)
    res = {"bare dispatch": [], "lazyxla": []}
    for _ in range(args.repeats):
        res["bare dispatch"].append(per_op_us(bare, args.ops))
        res["lazyxla"].append(per_op_us(lz, args.ops, after=lambda y: lazyxla.sync()))
    med = {k: statistics.median(v) for k, v in res.items()}
    best = {k: min(v) for k, v in res.items()}
    for k, v in med.items():
        print(f"{k:14s} {v:6.2f} us/op median, {best[k]:6.2f} best  (runs: {', '.join(f'{x:.2f}' for x in res[k])})")
    print(f"ratio lazyxla/bare = {med['lazyxla'] / med['bare dispatch']:.2f} (medians), "
          f"{best['lazyxla'] / best['bare dispatch']:.2f} (best runs)")


if __name__ == "__main__":
    main()
