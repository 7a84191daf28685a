"""The device loader against moving each batch by hand, on a small ResNet-style training loop.

A DataLoader gives batches of 32 images 3x32x32 (each sample normalized and randomly flipped
on the host, as an image pipeline does); a small ResNet (a stem convolution, two residual
blocks of two 3x3 convolutions with batch norm, a strided convolution, pooling, a linear
layer; a strided stem, so the blocks work on 16x16) trains with SGD and momentum, one program per step. Variant "by hand": each batch is
moved with ``.to(device)`` inside the loop, then ``lazyxla.sync()``. Variant "loader":
``lazyxla.data.DeviceLoader(loader, device)`` uploads the next batches in a background thread
while the current step is traced, and syncs at each batch. Each also runs with the loss read
every step (``loss.item()``, as a loop that logs every step does: the host then waits for
each program, so only the loader's background thread can prepare the next batch meanwhile).
All compile first (warm-up epochs), then run the same steps, alternating, several times; the
median time per step of each, the main thread's time per step spent getting the batch onto
the device (the DataLoader and the upload by hand; the wait for the next uploaded batch with
the loader, its sync excluded) and the ratios come from this one run.
Usage: python bench/loader.py [--steps N] [--repeats R] [--batch B] [--threads T]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import lazyxla
from lazyxla.engine import executor
from lazyxla.data import DeviceLoader


class Images(torch.utils.data.Dataset):
    """Random images and labels; each sample normalized and maybe flipped when fetched."""

    def __init__(self, n, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.rand(n, 3, 32, 32, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)
        self.mean = torch.tensor([0.49, 0.48, 0.45]).view(3, 1, 1)
        self.std = torch.tensor([0.25, 0.24, 0.26]).view(3, 1, 1)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = (self.x[i] - self.mean) / self.std
        if i % 2:
            x = x.flip(-1)
        return x, self.y[i]


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(x + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


def resnet():
    return nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         Block(16), Block(16), nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def train_step(model, opt, x, y):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


WAIT = [0.0]  # main-thread time spent getting each batch onto the device (sync time excluded)
SYNC = [0.0]  # time inside executor.sync (the loader syncs inside its next())


def by_hand(model, opt, loader, dev, read=False):
    it = iter(loader)
    while True:
        t0 = time.perf_counter()
        try:
            x, y = next(it)
        except StopIteration:
            break
        x, y = x.to(dev), y.to(dev)
        WAIT[0] += time.perf_counter() - t0
        loss = train_step(model, opt, x, y)
        lazyxla.sync()
        if read:
            loss.item()  # a loss logged every step: the host waits for the step's program
    return loss


def with_loader(model, opt, loader, dev, read=False):
    it = iter(DeviceLoader(loader, dev))
    while True:
        t0, s0 = time.perf_counter(), SYNC[0]
        try:
            x, y = next(it)
        except StopIteration:
            break
        WAIT[0] += time.perf_counter() - t0 - (SYNC[0] - s0)
        loss = train_step(model, opt, x, y)
        if read:
            lazyxla.sync()
            loss.item()
    return loss


def timed(fn, model, opt, loader, dev, read):
    WAIT[0] = 0.0
    t0 = time.perf_counter()
    loss = fn(model, opt, loader, dev, read)
    lazyxla.wait_device_ops()
    return (time.perf_counter() - t0) / len(loader), WAIT[0] / len(loader), loss


def _count_sync_time():
    inner = executor.sync

    def sync(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            SYNC[0] += time.perf_counter() - t0
    executor.sync = sync


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="steps per timed epoch (default 20)")
    ap.add_argument("--repeats", type=int, default=5, help="timed epochs of each variant (default 5)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (default: PyTorch's)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = lazyxla.device()
    _count_sync_time()
    torch.manual_seed(0)
    model = resnet().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = torch.utils.data.DataLoader(Images(args.batch * args.steps), batch_size=args.batch, shuffle=True,
                                         drop_last=True)
    for fn in (by_hand, with_loader, by_hand, with_loader):  # warm-up: compile the step's programs
        fn(model, opt, loader, dev, True)
    lazyxla.wait_device_ops()
    variants = [("by hand", by_hand, False), ("loader", with_loader, False),
                ("by hand, loss read each step", by_hand, True), ("loader, loss read each step", with_loader, True)]
    times = {name: [] for name, _, _ in variants}
    waits = {name: [] for name, _, _ in variants}
    for _ in range(args.repeats):
        for name, fn, read in variants:
            t, w, loss = timed(fn, model, opt, loader, dev, read)
            times[name].append(t)
            waits[name].append(w)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    t0 = time.perf_counter()
    for _ in loader:
        pass
    host = (time.perf_counter() - t0) / len(loader)
    print(f"batch {args.batch}x3x32x32, {args.steps} steps per epoch, {args.repeats} timed epochs of each variant, "
          f"final loss {loss.item():.4f}; the DataLoader alone: {host * 1e3:.2f} ms/batch")
    for name, ts in times.items():
        print(f"{name:30s} {med[name] * 1e3:7.2f} ms/step, of which getting the batch onto the device "
              f"{statistics.median(waits[name]) * 1e3:5.2f} ms (epochs: {', '.join(f'{t * 1e3:.2f}' for t in ts)})")
    print(f"by hand / loader: {med['by hand'] / med['loader']:.2f}x; with the loss read each step: "
          f"{med['by hand, loss read each step'] / med['loader, loss read each step']:.2f}x")


if __name__ == "__main__":
    main()
