"""End-to-end demo: train a small CNN on scikit-learn's digits on the lazy XLA device.

Its job is to show, with nothing but what a user program would touch (``lazyxla.device``,
``lazyxla.sync``, ``lazyxla.manual_seed`` and ``lazyxla.debug.metrics``), that a training
loop with a fixed batch shape compiles its step program during the first epoch and then
only finds it in the compilation cache: ``UncachedCompile`` stops climbing.

The data is ``sklearn.datasets.load_digits`` (1797 8x8 images, bundled, no download),
scaled to [0, 1] and split once with a fixed seed. The last incomplete training batch is
dropped so every step records the same graph. The loss is never read mid-graph: losses are
summed on the device inside the step graph and read only after ``lazyxla.sync()``, when
they are device data and reading them compiles nothing. Evaluation pads the ragged last
test batch to the batch size and masks it, so evaluation compiles one program.

``compiles_after_first_epoch`` is the increase of ``UncachedCompile`` from the end of the
first epoch to the end of training (evaluation's own program is not training's and is
reported separately as ``eval_uncached_compiles``).

It ends by writing the fold page of its run (``lazyxla.debug.fold_page``: every compiled key, its
uses and cost, folded in R3's order, and why each recompile happened) and prints its path:
``fold_path``, by default ``lazyxla-demo-fold.html`` in the temporary directory.

Usage: ``python -m lazyxla demo [--epochs N] [--batch-size B] [--quiet]`` or
``lazyxla.tools.demo.run(epochs=4, batch_size=64, quiet=False, fold_path=None)``; ``quiet`` turns
the progress bars off, the per-epoch lines and the summary are always printed.
"""
from __future__ import annotations

import os
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazyxla
import lazyxla.debug.metrics as met
from lazyxla.debug import explain, fold_page

SPLIT_SEED = 0
TEST_FRACTION = 0.1  # 1617 training images (25 steps of 64), 180 test images
LR = 3e-3
POSTFIX_EVERY = 4  # steps between progress-bar loss updates (each one waits for the device)


def make_model() -> nn.Module:
    """The small CNN for 1x8x8 images: two conv blocks down to 32x2x2, then an MLP head."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.1),
        nn.Linear(32 * 2 * 2, 64), nn.GELU(), nn.Linear(64, 10),
    )


def load_data(seed: int | None = None):
    """Digits as float32 (N, 1, 8, 8) images in [0, 1] and int64 labels: a fixed train/test split."""
    seed = SPLIT_SEED if seed is None else seed
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0)[:, None, :, :]
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=TEST_FRACTION, random_state=seed,
                                              stratify=y)
    return (torch.from_numpy(x_tr), torch.from_numpy(y_tr),
            torch.from_numpy(x_te), torch.from_numpy(y_te))


def _counts():
    return met.counter_value("UncachedCompile") or 0, met.counter_value("CachedCompile") or 0


def _evaluate(model, x_te, y_te, batch_size, dev):
    """Test accuracy on the device: fixed-size batches, the last one padded and masked."""
    model.eval()
    n = len(y_te)
    correct = torch.zeros((), dtype=torch.int64).to(dev)  # device data, not pending IR
    with torch.no_grad():
        for start in range(0, n, batch_size):
            xb, yb = x_te[start:start + batch_size], y_te[start:start + batch_size]
            k = len(yb)
            mask = torch.ones(batch_size, dtype=torch.bool)
            if k < batch_size:  # pad to the fixed shape; padded rows are masked out
                xb = torch.cat([xb, xb.new_zeros((batch_size - k,) + tuple(xb.shape[1:]))])
                yb = torch.cat([yb, yb.new_zeros(batch_size - k)])
                mask[k:] = False
            xb, yb, mask = xb.to(dev), yb.to(dev), mask.to(dev)
            pred = model(xb).argmax(dim=1)
            correct = correct + ((pred == yb) & mask).sum()
            lazyxla.sync()
    return correct.item() / n


def run(epochs: int = 4, batch_size: int = 64, quiet: bool = False, fold_path: str | None = None) -> dict:
    """Train, evaluate, print a compile summary, write the fold page; return the numbers as a dict."""
    from tqdm import tqdm

    t_start = time.perf_counter()
    since = explain.mark()  # the page is this run's: a process that compiled before keeps its keys off it
    lazyxla.manual_seed(0)
    torch.manual_seed(0)
    dev = lazyxla.device()

    x_tr, y_tr, x_te, y_te = load_data()
    model = make_model().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    shuffle = torch.Generator().manual_seed(0)
    steps = len(y_tr) // batch_size  # drop the last incomplete batch
    if steps == 0:
        raise ValueError(f"batch size {batch_size} exceeds the {len(y_tr)} training images")

    u0, c0 = _counts()
    t0_compile = (met.metric_data("CompileTime") or (0, 0, []))[1]
    epoch_losses = []
    uncached_after_epoch1 = None
    for epoch in range(1, epochs + 1):
        model.train()
        perm = torch.randperm(len(y_tr), generator=shuffle)
        loss_sum = torch.zeros(()).to(dev)  # device data; the step graph adds to it
        bar = tqdm(range(steps), desc=f"epoch {epoch}/{epochs}", disable=quiet, leave=True)
        for i in bar:
            idx = perm[i * batch_size:(i + 1) * batch_size]
            xb, yb = x_tr[idx].to(dev), y_tr[idx].to(dev)
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            loss_sum = loss_sum + loss.detach()
            lazyxla.sync()
            if not quiet and ((i + 1) % POSTFIX_EVERY == 0 or i + 1 == steps):
                # after sync loss_sum is device data: reading it compiles nothing
                bar.set_postfix({"loss": f"{loss_sum.item() / (i + 1):.4f}",
                                 "UncachedCompile": _counts()[0] - u0})
        bar.close()
        mean_loss = loss_sum.item() / steps
        epoch_losses.append(mean_loss)
        u, c = _counts()
        if epoch == 1:
            uncached_after_epoch1 = u
        print(f"epoch {epoch}: train loss {mean_loss:.4f}  UncachedCompile {u - u0}  "
              f"CachedCompile {c - c0}")

    u_train, _ = _counts()
    compiles_after_first = (u_train - uncached_after_epoch1) if uncached_after_epoch1 is not None else 0
    accuracy = _evaluate(model, x_te, y_te, batch_size, dev)
    u, c = _counts()
    compile_s = ((met.metric_data("CompileTime") or (0, 0, []))[1] - t0_compile) / 1e9
    seconds = time.perf_counter() - t_start

    print(f"test accuracy: {accuracy:.4f} ({len(y_te)} images)")
    print(f"compiles: UncachedCompile {u - u0} (training {u_train - u0}, evaluation {u - u_train}), "
          f"CachedCompile {c - c0}, CompileTime {compile_s:.2f} s")
    if epochs < 2:
        print("UncachedCompile after the first epoch: only one epoch ran, nothing to compare.")
    elif compiles_after_first == 0:
        print(f"UncachedCompile stopped climbing after the first epoch: {uncached_after_epoch1 - u0} "
              f"at the end of epoch 1 and {u_train - u0} at the end of training; every later step "
              f"was a cache hit.")
    else:
        print(f"UncachedCompile kept climbing after the first epoch: {uncached_after_epoch1 - u0} "
              f"at the end of epoch 1, {u_train - u0} at the end of training "
              f"(+{compiles_after_first}).")
    print(f"total time {seconds:.1f} s")
    fold_path = fold_path or os.path.join(tempfile.gettempdir(), "lazyxla-demo-fold.html")
    fold_page.write(fold_path, explain.export(since))
    print(f"fold page: {os.path.abspath(fold_path)}")
    return {
        "test_accuracy": accuracy,
        "uncached_compiles": u - u0,
        "cached_compiles": c - c0,
        "compiles_after_first_epoch": compiles_after_first,
        "eval_uncached_compiles": u - u_train,
        "compile_seconds": compile_s,
        "epoch_losses": epoch_losses,
        "seconds": seconds,
        "fold_page": os.path.abspath(fold_path),
    }
