"""What the value checks cost (``LAZYXLA_CHECK_VALUES``): the same warm steps with the checks on
and off, in new processes (the switch is read once, at import), alternated so that the machine's
drift falls on both alike.

- ``mlp``: bench/step.py's step (MLP 784-512-512-10, batch 128, SGD momentum, cross-entropy,
  whose targets are checked);
- ``embedding``: an embedding-heavy step (vocabulary 8192, width 64, batch 64 x 128 tokens,
  mean-pooled, a linear head, cross-entropy, Adam): every token index checked;
- ``lookup``: only the embedding lookup and a sum, synced: the check's share where the program
  is nothing but indexing.

Each child prints its ms per step (the median of ``--repeats`` timed loops of ``--steps`` steps,
each step synced and the last one waited for); the parent prints, per step kind, the medians
with the checks on and off and their ratio.
Usage: python bench/checks.py [--steps N] [--repeats R] [--rounds K]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _mlp(dev):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(128, 784).to(dev), torch.randint(0, 10, (128,)).to(dev)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def _embedding(dev):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.manual_seed(0)
    emb, head = nn.Embedding(8192, 64).to(dev), nn.Linear(64, 16).to(dev)
    opt = torch.optim.Adam(list(emb.parameters()) + list(head.parameters()), lr=1e-3)
    tokens, y = torch.randint(0, 8192, (64, 128)).to(dev), torch.randint(0, 16, (64,)).to(dev)

    def step():
        opt.zero_grad()
        F.cross_entropy(head(emb(tokens).mean(1)), y).backward()
        opt.step()
    return step


def _lookup(dev):
    import torch
    torch.manual_seed(0)
    w = torch.randn(8192, 64).to(dev)
    tokens = torch.randint(0, 8192, (64, 128)).to(dev)
    out = []

    def step():
        out[:] = [torch.nn.functional.embedding(tokens, w).sum()]
    return step


KINDS = {"mlp": _mlp, "embedding": _embedding, "lookup": _lookup}


def child(kind, steps, repeats):
    import lazyxla
    dev = lazyxla.device()
    step = KINDS[kind](dev)
    for _ in range(5):
        step()
        lazyxla.sync()
    lazyxla.wait_device_ops()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
            lazyxla.sync()
        lazyxla.wait_device_ops()
        times.append((time.perf_counter() - t0) / steps * 1e3)
    print(json.dumps({"ms": statistics.median(times)}))


def run(kind, on, steps, repeats):
    env = dict(os.environ, LAZYXLA_CHECK_VALUES="1" if on else "0")
    p = subprocess.run([sys.executable, __file__, "--child", kind, "--steps", str(steps), "--repeats", str(repeats)],
                       capture_output=True, text=True, env=env, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])["ms"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="new processes per setting, alternated")
    ap.add_argument("--child", choices=sorted(KINDS))
    ap.add_argument("--kinds", default="mlp,embedding,lookup")
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child, args.steps, args.repeats)
    print(f"value checks on/off, ms per warm step (median of {args.rounds} processes each, alternated)")
    for kind in args.kinds.split(","):
        on, off = [], []
        for _ in range(args.rounds):
            on.append(run(kind, True, args.steps, args.repeats))
            off.append(run(kind, False, args.steps, args.repeats))
        m_on, m_off = statistics.median(on), statistics.median(off)
        print(f"  {kind:<10} on {m_on:8.3f}  off {m_off:8.3f}  on/off {m_on / m_off:.3f}  "
              f"(on {', '.join(f'{x:.3f}' for x in on)}; off {', '.join(f'{x:.3f}' for x in off)})")


if __name__ == "__main__":
    main()
