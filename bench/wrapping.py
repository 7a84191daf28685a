"""Call overhead of a program with 5000 small inputs, with and without parameter wrapping.

Each variant runs in its own process (the threshold is read once): 5000 tensors of 4 floats
are summed on the lazy device; the compiled program is then called directly in a loop on
its arguments. Prints microseconds per call and the ratio, measured in this one run.
Usage: python bench/wrapping.py [--inputs N] [--calls K]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap

CHILD = """
import time, torch, jax, lazyxla
from lazyxla.run import execution
from lazyxla.engine import executor
from lazyxla.compiler.cache import computation_cache
d = lazyxla.device()
ts = [torch.full((4,), float(i)).to(d) for i in range({n})]
total = ts[0] * 1
for t in ts[1:]:
    total = total + t
cap = {{}}
orig = execution.run
def spy(executable, inputs, n_outputs, key_hex):
    cap["args"] = [execution.resolve(d) for d in inputs]
    return orig(executable, inputs, n_outputs, key_hex)
executor.run = spy
lazyxla.sync()
prog = computation_cache().values()[-1]
hlo = prog.executable.as_text()
wrapped = "arg_tuple" in [l for l in hlo.splitlines() if l.startswith("ENTRY")][0]
args = cap["args"]
for _ in range(5):
    jax.block_until_ready(prog.executable(*args))
t0 = time.perf_counter()
for _ in range({k}):
    out = prog.executable(*args)
jax.block_until_ready(out)
print(wrapped, (time.perf_counter() - t0) / {k} * 1e6)
"""


def run(threshold, n, k):
    env = dict(os.environ, XLA_PARAMETER_WRAPPING_THREADSHOLD=str(threshold))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD.format(n=n, k=k))], capture_output=True,
                       text=True, env=env, timeout=1800)
    if r.returncode:
        raise SystemExit(r.stderr)
    wrapped, us = r.stdout.split()
    return wrapped == "True", float(us)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--inputs", type=int, default=5000)
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args(argv)
    w, us_w = run(3200, a.inputs, a.calls)
    f, us_f = run(10 ** 9, a.inputs, a.calls)
    assert w and not f
    print(f"{a.inputs} inputs: wrapped {us_w:.1f} us/call, flat {us_f:.1f} us/call, ratio wrapped/flat = "
          f"{us_w / us_f:.2f}")


if __name__ == "__main__":
    main()
