"""Per-device memory of a sharded parameter: 8-way sharded against replicated (issue 12).

Runs on 8 CPU devices (sets CPU_NUM_DEVICES before lazyxla starts JAX). Prints the bytes each
device holds for a 4096x1024 float32 parameter replicated and sharded over 8 devices, and the
same after an SGD step (the layout survives the update), and the ratio.
Usage: python bench/spmd.py
"""
from __future__ import annotations

import os

os.environ.setdefault("CPU_NUM_DEVICES", "8")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import lazyxla  # noqa: E402
import lazyxla.distributed.spmd as xs  # noqa: E402
import lazyxla.runtime as xr  # noqa: E402


def per_device_bytes(t) -> list:
    data = t._state.storage.data
    arr = getattr(data, "array", data)
    return [s.data.nbytes for s in arr.addressable_shards]


def main():
    xr.use_spmd()
    dev = lazyxla.device()
    mesh = xs.get_1d_mesh("fsdp")
    rep = torch.nn.Parameter(torch.randn(4096, 1024).to(dev))
    sh = torch.nn.Parameter(torch.randn(4096, 1024).to(dev))
    xs.mark_sharding(sh, mesh, ("fsdp", None))
    full = 4096 * 1024 * 4
    r, s = per_device_bytes(rep), per_device_bytes(sh)
    print(f"parameter: {full} bytes; devices: {len(s)}")
    print(f"replicated: {max(r)} bytes per device; sharded: {max(s)} bytes per device "
          f"(ratio {max(s) / max(r):.4f}, 1/8 = {1 / 8:.4f})")
    opt = torch.optim.SGD([rep, sh], lr=0.1)
    (rep.sum() + sh.sum()).backward()
    opt.step()
    lazyxla.sync()
    print(f"after an SGD step: sharded {max(per_device_bytes(sh))} bytes per device, "
          f"spec {xs.get_sharding_spec(sh)}")


if __name__ == "__main__":
    main()
