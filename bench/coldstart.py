"""Time to the first finished training step of the demo model in a fresh process,
with an empty persistent cache (cold), with the cache it left behind (warm), and in PyTorch
eager on the CPU (what the first step costs without lazyxla: issue 14's yardstick).

Each run is a new Python process; the time is measured inside it from just before the
model is built to the end of the first step (sync and wait), so interpreter and import
time are reported apart. Prints both times and the ratio, measured in this one run.
Usage: python bench/coldstart.py [--repeats R]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

CHILD = """
import time
t_start = time.perf_counter()
import torch, torch.nn.functional as F
import lazyxla
from lazyxla.tools import demo
import lazyxla.debug.metrics as met
x_tr, y_tr, _, _ = demo.load_data()  # the data set is not the framework's cost
t_import = time.perf_counter()
torch.manual_seed(0)
dev = lazyxla.device() if DEVICE == "lazyxla" else "cpu"
model = demo.make_model().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=demo.LR)
x, y = x_tr[:64].to(dev), y_tr[:64].to(dev)
opt.zero_grad()
F.cross_entropy(model(x), y).backward()
opt.step()
if DEVICE == "lazyxla":
    lazyxla.sync()
    lazyxla.wait_device_ops()
t_end = time.perf_counter()
c = lambda k: met.counter_value(k) or 0
print(t_import - t_start, t_end - t_import, c("UncachedCompile"), c("PersistentCacheHit"))
"""


def child(cache_dir, device="lazyxla"):
    env = dict(os.environ, XLA_PERSISTENT_CACHE_PATH=cache_dir)
    code = f"DEVICE = {device!r}\n" + textwrap.dedent(CHILD)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    if r.returncode:
        raise SystemExit(r.stderr)
    imp, step, uncached, hits = r.stdout.split()
    return float(imp), float(step), int(uncached), int(hits)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    cold, warm, eager, imports = [], [], [], []
    for _ in range(a.repeats):
        with tempfile.TemporaryDirectory() as d:
            i1, s1, u1, h1 = child(d)
            i2, s2, u2, h2 = child(d)
            assert h1 == 0 and u2 == 0 and h2 >= 1, (u1, h1, u2, h2)
            cold.append(s1)
            warm.append(s2)
            imports += [i1, i2]
            eager.append(child(d, "cpu")[1])
    c, w, e = statistics.median(cold), statistics.median(warm), statistics.median(eager)
    print(f"first training step of the demo model: cold {c * 1e3:.0f} ms (compiles), "
          f"warm {w * 1e3:.0f} ms (persistent cache hits); ratio cold/warm = {c / w:.1f}")
    print(f"PyTorch eager's first step of the same model in a fresh process: {e * 1e3:.0f} ms; "
          f"warm/eager = {w / e:.2f} (issue 14's target: <= 1.5)")
    print(f"(python, imports and loading the data set: {statistics.median(imports):.2f} s per process, "
          "not included)")


if __name__ == "__main__":
    main()
