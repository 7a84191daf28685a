"""Data parallel over processes: the MLP step of step.py (784-512-512-10, batch 128, SGD with
momentum) on 2 processes x 1 device, each on half the batch with its gradients averaged by
``lazyxla.distributed.optimizer_step``, against the same step in 1 process on the whole batch.

Prints, all in this one run: ms per step of 1 process; of 2 processes with the gradient
all-reduce; of 2 processes each stepping alone on its half (no collective): the difference is
what the collective costs per step; and the bytes each process sent per step over the loopback
(``/proc/net/dev``, every byte on ``lo`` while the steps ran, halved: the all-reduce, gloo's
and the coordinator's traffic) against the gradients' size. On 2 cores expect no speed-up: the
two processes share them. For scale, it also times JAX's own ``psum`` of the gradients' bytes
between two otherwise idle processes. Usage: python bench/multiprocess.py [--steps N]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step import make_data, torch_model  # noqa: E402


def _lo_bytes() -> int:
    try:
        with open("/proc/net/dev") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == "lo":
                    return int(rest.split()[8])  # transmitted bytes
    except OSError:
        pass
    return -1


def _loop(reduce, steps, out):
    import lazyxla
    import lazyxla.distributed as xd
    import lazyxla.runtime as xr
    D = lazyxla.device()
    n, r = xr.world_size(), xr.global_ordinal()
    model = torch_model().to(D)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = make_data()
    x, y = x.chunk(n)[r].to(D), y.chunk(n)[r].to(D)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if reduce:
            xd.optimizer_step(opt)
        else:
            opt.step()
        lazyxla.sync()
    for _ in range(5):
        step()
    lazyxla.wait_device_ops()
    xd.rendezvous("start")
    b0, t0 = _lo_bytes(), time.perf_counter()
    for _ in range(steps):
        step()
    lazyxla.wait_device_ops()
    dt, b1 = time.perf_counter() - t0, _lo_bytes()
    xd.rendezvous("stop")
    if r == 0 and out:
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        with open(out, "w") as f:
            json.dump({"ms": dt / steps * 1e3, "lo_bytes": (b1 - b0) / steps / n if b0 >= 0 else None,
                       "grad_bytes": grad_bytes}, f)


def _raw_psum(index, n_floats, steps, out):
    """JAX's own psum of the gradients' bytes, between the same processes: the floor."""
    import jax
    import numpy as np
    import lazyxla.distributed as xd
    from lazyxla.distributed.world import AXIS, process_mesh
    mesh = process_mesh()
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    x = jax.device_put(np.ones(n_floats, np.float32), jax.local_devices()[0])
    g = jax.make_array_from_single_device_arrays(x.shape, rep, [x])
    f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, AXIS), mesh=mesh, in_specs=jax.sharding.PartitionSpec(),
                              out_specs=jax.sharding.PartitionSpec(), check_vma=False))
    for _ in range(5):
        f(g).block_until_ready()
    xd.rendezvous("start")
    t0 = time.perf_counter()
    for _ in range(steps):
        f(g).block_until_ready()
    dt = time.perf_counter() - t0
    if index == 0:
        with open(out, "w") as fh:
            json.dump({"ms": dt / steps * 1e3}, fh)


def _job(index, reduce, steps, out):
    _loop(reduce, steps, out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # internal: the 1-process run
    args = ap.parse_args(argv)
    if args.one:
        _loop(args.one[0] == "1", args.steps, args.one[1])
        return
    import subprocess
    import lazyxla.distributed as xd
    with tempfile.TemporaryDirectory() as tmp:
        res = {}
        one = os.path.join(tmp, "one.json")
        subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--one", "0", one], check=True)
        res["1 process, whole batch"] = json.load(open(one))
        for name, reduce in (("2 processes, all-reduce", True), ("2 processes, no collective", False)):
            out = os.path.join(tmp, f"{reduce}.json")
            xd.spawn(_job, args=(reduce, args.steps, out), nprocs=2)
            res[name] = json.load(open(out))
        raw = os.path.join(tmp, "raw.json")
        n_floats = res["2 processes, all-reduce"]["grad_bytes"] // 4
        xd.spawn(_raw_psum, args=(n_floats, args.steps, raw), nprocs=2)
        raw_ms = json.load(open(raw))["ms"]
    base = res["1 process, whole batch"]["ms"]
    for k, v in res.items():
        sent = f", sent {v['lo_bytes'] / 1e6:.2f} MB/step per process" if v.get("lo_bytes") is not None else ""
        print(f"{k:28s} {v['ms']:7.2f} ms/step  ratio to 1 process {v['ms'] / base:.2f}{sent}")
    with_c, without = res["2 processes, all-reduce"], res["2 processes, no collective"]
    print(f"the gradient all-reduce costs {with_c['ms'] - without['ms']:.2f} ms per step "
          f"(ratio {with_c['ms'] / without['ms']:.2f} to the same processes without it); JAX's own psum of "
          f"the same bytes between two idle processes: {raw_ms:.2f} ms")
    if with_c.get("lo_bytes") is not None:
        print(f"bytes sent per step per process / gradient bytes ({with_c['grad_bytes'] / 1e6:.2f} MB) = "
              f"{with_c['lo_bytes'] / with_c['grad_bytes']:.2f} (without the collective: "
              f"{without['lo_bytes'] / with_c['grad_bytes']:.3f})")


if __name__ == "__main__":
    main()
