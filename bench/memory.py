"""Peak resident memory of updating 1 GiB of parameters in place, with and without donation.

Each variant runs in a fresh process: 16 parameters of 64 MiB (float32) are made on the
device, then updated in place (p = 0.9 * p + 0.1) for a few synced steps. Reports the peak
resident set size above the process's size before the parameters existed, in units of the
parameters' size; XLA_ENABLE_PARAM_ALIASING=0 turns donation off. Both in this one run.
Usage: python bench/memory.py [--gib G] [--steps S]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap

CHILD = """
import resource, torch, lazyxla
def rss_peak(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
d = lazyxla.device()
warm = torch.zeros(4, device=d) + 1   # JAX and the compiler up before the baseline
lazyxla.sync(); lazyxla.wait_device_ops()
base = rss_peak()
n = int({gib} * 2**30 / 4 / 16)
ps = [torch.zeros(n, device=d) for _ in range(16)]
lazyxla.sync(); lazyxla.wait_device_ops()
after_init = rss_peak()
for _ in range({steps}):
    for p in ps:
        p.mul_(0.9).add_(0.1)
    lazyxla.sync()
lazyxla.wait_device_ops()
assert abs(ps[3][:4].cpu() - (1 - 0.9 ** {steps})).max() < 1e-5
print(base, after_init, rss_peak(), 16 * n * 4)
"""


def child(aliasing, gib, steps):
    env = dict(os.environ, XLA_ENABLE_PARAM_ALIASING="1" if aliasing else "0")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD.format(gib=gib, steps=steps))],
                       capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode:
        raise SystemExit(r.stderr)
    base, init, peak, size = map(int, r.stdout.split())
    return (init - base) / size, (peak - base) / size


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args(argv)
    for aliasing in (True, False):
        init, peak = child(aliasing, a.gib, a.steps)
        print(f"donation {'on ' if aliasing else 'off'}: peak {peak:.2f}x the parameters while updating "
              f"(after creating them: {init:.2f}x)")


if __name__ == "__main__":
    main()
