"""What the value checks cost (``LAZYXLA_CHECK_VALUES``): the same warm steps with the checks on
and off, in new processes (the switch is read once, at import), alternated so that the machine's
drift falls on both alike.

- ``mlp``: bench/step.py's step (MLP 784-512-512-10, batch 128, SGD momentum, cross-entropy,
  whose targets are checked);
- ``embedding``: an embedding-heavy step (vocabulary 8192, width 64, batch 64 x 128 tokens,
  mean-pooled, a linear head, cross-entropy, Adam): every token index checked;
- ``lookup``: only the embedding lookup and a sum, synced: the check's share where the program
  is nothing but indexing.

Per round, two new children, one with the checks on and one off, take turns: each block of
``--steps`` steps runs in one while the other waits, so the machine's drift (2x within minutes
here) falls on neighbouring blocks alike; new rounds average out what a process's own layout
does to its speed (up to 20% here). Per step kind the parent prints the median ms per step of
each setting, and the median over rounds of each round's median block ratio (on/off).
Usage: python bench/checks.py [--steps N] [--pairs K] [--rounds R] [--kinds mlp,embedding,lookup]
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


def child(kind):
    """Serve ``N`` (a line on stdin) with the ms per step of N warm steps (each synced, the last
    waited for), printed as a line; until stdin closes."""
    import lazyxla
    dev = lazyxla.device()
    step = KINDS[kind](dev)
    for _ in range(5):
        step()
        lazyxla.sync()
    lazyxla.wait_device_ops()
    print("ready", flush=True)
    for line in sys.stdin:
        n = int(line)
        t0 = time.perf_counter()
        for _ in range(n):
            step()
            lazyxla.sync()
        lazyxla.wait_device_ops()
        print(json.dumps({"ms": (time.perf_counter() - t0) / n * 1e3}), flush=True)


class Child:
    def __init__(self, kind, on):
        env = dict(os.environ, LAZYXLA_CHECK_VALUES="1" if on else "0")
        self.p = subprocess.Popen([sys.executable, __file__, "--child", kind], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)
        while self.p.stdout.readline().strip() != "ready":
            if self.p.poll() is not None:
                raise RuntimeError(f"the {kind} child ended")

    def block(self, n):
        self.p.stdin.write(f"{n}\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())["ms"]

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def compare(kind, steps, pairs, rounds):
    """Per round, a new pair of children (a process's own layout moves its speed by up to 20%
    here, so one pair is not enough): the median of that pair's block ratios. Returns the
    medians of ms per step on and off over all blocks, and the rounds' ratios."""
    a, b, per_round = [], [], []
    for r in range(rounds):
        if r % 2:  # which process starts first moves its speed too (an A/A run here: 4%)
            off, on = Child(kind, False), Child(kind, True)
        else:
            on, off = Child(kind, True), Child(kind, False)
        try:
            ra, rb = [], []
            for i in range(pairs):
                if i % 2:  # alternate which goes first
                    rb.append(off.block(steps))
                    ra.append(on.block(steps))
                else:
                    ra.append(on.block(steps))
                    rb.append(off.block(steps))
        finally:
            on.close()
            off.close()
        a += ra
        b += rb
        per_round.append(statistics.median(x / y for x, y in zip(ra, rb)))
    return statistics.median(a), statistics.median(b), sorted(per_round)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=20, help="steps per block")
    ap.add_argument("--pairs", type=int, default=20, help="blocks per setting and round, alternated")
    ap.add_argument("--rounds", type=int, default=8, help="new pairs of processes")
    ap.add_argument("--child", choices=sorted(KINDS))
    ap.add_argument("--kinds", default="mlp,embedding,lookup")
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child)
    print(f"value checks on/off: ms per warm step; {args.rounds} rounds of a new pair of processes, "
          f"each {args.pairs} blocks of {args.steps} steps per setting, in turn")
    for kind in args.kinds.split(","):
        m_on, m_off, rs = compare(kind, args.steps, args.pairs, args.rounds)
        print(f"  {kind:<10} on {m_on:8.3f}  off {m_off:8.3f}  on/off {statistics.median(rs):.3f} "
              f"(the {len(rs)} rounds: {', '.join(f'{r:.3f}' for r in rs)})")


if __name__ == "__main__":
    main()
