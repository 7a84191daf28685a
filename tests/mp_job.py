"""A data-parallel job for tests/test_multiprocess.py, launched as
``python mp_job.py spawn OUT`` (lazyxla.distributed.spawn, 2 processes), under
``python mp_job.py replay OUT`` (the step captured and replayed in both processes),
``torchrun --nproc_per_node=2 mp_job.py torchrun OUT`` (then also torch.distributed and DDP,
written to ``OUT.ddp.<rank>.json``), ``... mp_job.py ranks OUT`` (ranks and one all-reduce), or ``python mp_job.py die OUT``
(process 1 dies mid-training), or ``python mp_job.py spmd OUT`` (SPMD over 2 processes x 2
devices). Each process writes ``OUT.<rank>.json``."""
from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import lazyxla
import lazyxla.debug.metrics as met
import lazyxla.distributed as xd
import lazyxla.runtime as xr


def data(i):
    g = torch.Generator().manual_seed(i)
    return torch.randn(16, 12, generator=g), torch.randint(0, 5, (16,), generator=g)


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 5))


def reference(steps=5):
    """One process trained on the full batch."""
    ref = model()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for i in range(steps):
        x, y = data(i)
        opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        opt.step()
    return [p.detach().tolist() for p in ref.parameters()]


def train(index, out):
    D = lazyxla.device()
    n, r = xr.world_size(), xr.global_ordinal()
    m = model().to(D)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    compiles, hashes = [], []
    for i in range(5):
        x, y = data(i)
        x, y = x.chunk(n)[r], y.chunk(n)[r]  # this process's half of the batch
        opt.zero_grad()
        F.cross_entropy(m(x.to(D)), y.to(D)).backward()
        xd.optimizer_step(opt)
        hashes.append(lazyxla.graph_hash(list(m.parameters())))
        lazyxla.sync()
        compiles.append(met.counter_value("UncachedCompile"))
    t = torch.tensor([float(r + 1)] * 4).to(D)
    res = {"rank": r, "world": n, "local": xr.local_ordinal(), "compiles": compiles, "hashes": hashes,
           "params": [p.cpu().tolist() for p in m.parameters()],
           "sum": xd.all_reduce(xd.REDUCE_SUM, t, scale=0.5).cpu().tolist(),
           "max": xd.all_reduce(xd.REDUCE_MAX, t).cpu().tolist(),
           "min": xd.all_reduce(xd.REDUCE_MIN, t).cpu().tolist(),
           "gather": xd.all_gather(t[:2] * 1, dim=0).cpu().tolist(),
           "scatter": xd.reduce_scatter(xd.REDUCE_SUM, t, 1.0, 0, n).cpu().tolist()}
    xd.rendezvous("done")
    with open(f"{out}.{r}.json", "w") as f:
        json.dump(res, f)


def train_replay(index, out):
    """The data-parallel step captured once (``lazyxla.graph``) and replayed in every process:
    the all-reduce of ``optimizer_step`` is inside the replayed program."""
    D = lazyxla.device()
    n, r = xr.world_size(), xr.global_ordinal()
    m = model().to(D)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(m(x), y).backward()
        xd.optimizer_step(opt)

    def part(i):
        x, y = data(i)
        return x.chunk(n)[r].to(D), y.chunk(n)[r].to(D)

    step(*part(0))
    lazyxla.sync()
    sx, sy = part(1)
    g = lazyxla.Graph()
    with lazyxla.graph(g):
        step(sx, sy)
    e0 = met.counter_value("ExecuteComputation")
    for i in range(1, 5):
        x, y = part(i)
        sx.copy_(x)
        sy.copy_(y)
        g.replay()
    res = {"rank": r, "params": [p.cpu().tolist() for p in m.parameters()], "hash": g.graph_hash,
           "replays": met.counter_value("GraphReplay"), "executions": met.counter_value("ExecuteComputation") - e0}
    xd.rendezvous("done")
    with open(f"{out}.{r}.json", "w") as f:
        json.dump(res, f)


def train_ddp(out):
    """torch.distributed on lazy tensors: the collectives, and DistributedDataParallel."""
    import torch.distributed as dist
    dist.init_process_group("lazyxla")
    D = lazyxla.device()
    n, r = dist.get_world_size(), dist.get_rank()
    t = torch.tensor([float(r + 1)] * 2).to(D)
    res = {}
    a = t.clone()
    dist.all_reduce(a)
    b = t.clone()
    dist.all_reduce(b, op=dist.ReduceOp.AVG)
    c = t.clone()
    dist.broadcast(c, 1)
    outs = [torch.zeros(2).to(D) for _ in range(n)]
    dist.all_gather(outs, t)
    g = torch.zeros(2 * n).to(D)
    dist.all_gather_into_tensor(g, t)
    rs = torch.zeros(1).to(D)
    dist.reduce_scatter_tensor(rs, t)
    rsl = torch.zeros(2).to(D)
    dist.reduce_scatter(rsl, [t * (k + 1) for k in range(n)])  # block k: t * (k + 1)
    dist.barrier()
    res["dist"] = {"sum": a.cpu().tolist(), "avg": b.cpu().tolist(), "broadcast": c.cpu().tolist(),
                   "gather": [o.cpu().tolist() for o in outs], "gather_into": g.cpu().tolist(),
                   "reduce_scatter": rs.cpu().tolist(), "reduce_scatter_list": rsl.cpu().tolist()}
    m = torch.nn.parallel.DistributedDataParallel(model().to(D))
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    compiles, executions = [], []
    for i in range(5):
        x, y = data(i)
        opt.zero_grad()
        F.cross_entropy(m(x.chunk(n)[r].to(D)), y.chunk(n)[r].to(D)).backward()
        opt.step()
        lazyxla.sync()
        compiles.append(met.counter_value("UncachedCompile"))
        executions.append(met.counter_value("ExecuteComputation"))
    res["ddp"] = {"params": [p.cpu().tolist() for p in m.module.parameters()], "compiles": compiles,
                  "executions": executions}
    with open(f"{out}.ddp.{r}.json", "w") as f:
        json.dump(res, f)


def train_spmd(index, out):
    """SPMD across the processes: one mesh over every process's devices, each process feeding its
    part of the batch (xs.global_tensor), the weights sharded FSDP-style."""
    import numpy as np
    import lazyxla.distributed.spmd as xs
    xr.use_spmd()
    n, r = xr.world_size(), xr.global_ordinal()
    ndev = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(ndev), (ndev,), ("data",))
    m = model().to(lazyxla.device())
    for p in m.parameters():
        if p.shape[0] % ndev == 0:
            xs.mark_sharding(p, mesh, ("data",) + (None,) * (p.dim() - 1))
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    compiles, hashes, losses = [], [], []
    for i in range(5):
        x, y = data(i)
        lx = xs.global_tensor(x.chunk(n)[r], mesh, ("data", None))
        ly = xs.global_tensor(y.chunk(n)[r], mesh, ("data",))
        opt.zero_grad()
        loss = F.cross_entropy(m(lx), ly)
        loss.backward()
        opt.step()
        hashes.append(lazyxla.graph_hash(list(m.parameters())))
        lazyxla.sync()
        losses.append(loss.item())
        compiles.append(met.counter_value("UncachedCompile"))
    res = {"rank": r, "world": n, "devices": ndev, "compiles": compiles, "hashes": hashes, "losses": losses,
           "params": [p.cpu().tolist() for p in m.parameters()], "batch_shape": list(lx.shape),
           "specs": [xs.get_sharding_spec(p) for p in m.parameters()]}
    with open(f"{out}.{r}.json", "w") as f:
        json.dump(res, f)


def die(index, out):
    D = lazyxla.device()
    t = torch.ones(4).to(D)
    t0 = time.time()
    try:
        for i in range(100000):
            t = xd.all_reduce(xd.REDUCE_SUM, t, scale=0.5)
            lazyxla.sync()
            if index == 1 and i == 3:
                os._exit(9)  # killed mid-training
            t.cpu()
    except Exception as e:
        with open(f"{out}.{index}.json", "w") as f:
            json.dump({"error": str(e), "seconds": time.time() - t0}, f)
        raise


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    if mode == "torchrun":
        xd.init()
        train(xr.global_ordinal(), out)
        train_ddp(out)
    elif mode == "ranks":  # who is who, and one all-reduce
        xd.init()
        t = torch.tensor([float(xr.global_ordinal() + 1)]).to(lazyxla.device())
        with open(f"{out}.{xr.global_ordinal()}.json", "w") as f:
            json.dump({"rank": xr.global_ordinal(), "world": xr.world_size(), "local": xr.local_ordinal(),
                       "sum": xd.all_reduce(xd.REDUCE_SUM, t).cpu().item()}, f)
    elif mode == "spawn":
        xd.spawn(train, args=(out,), nprocs=2)
    elif mode == "replay":
        xd.spawn(train_replay, args=(out,), nprocs=2)
    elif mode == "spmd":
        os.environ["CPU_NUM_DEVICES"] = "2"  # 2 processes x 2 devices: one mesh of 4
        xd.spawn(train_spmd, args=(out,), nprocs=2)
    elif mode == "die":
        try:
            xd.spawn(die, args=(out,), nprocs=2)
        except Exception as e:
            print(json.dumps({"spawn_error": str(e)}))
