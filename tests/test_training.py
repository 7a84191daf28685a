"""Issue 2, point 8: an MLP and a small CNN train on the lazy device and match PyTorch eager.

Forward, backward and optimizer step, 5 steps, losses and final weights within 1e-4 relative,
with SGD (momentum) and AdamW, gradient clipping, and no new compile after the warm-up steps.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazyxla
import lazyxla.debug.metrics as met
from lazyhelp import needs_wide_int64

DEV = lazyxla.device()


def mlp():
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(), nn.Dropout(0.0),
                         nn.Linear(32, 5))


def cnn():
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 8, 3),
                         nn.GELU(), nn.Flatten(), nn.Dropout(0.0), nn.Linear(8 * 2 * 2, 5))


def data(kind, n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g) if kind == "mlp" else torch.randn(n, 1, 8, 8, generator=g)
    return x, torch.randint(0, 5, (n,), generator=g), torch.randn(n, 5, generator=g)


OPTS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.01),
    "adamw-foreach-off": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False),
}


def train(model, opt_fn, kind, loss_kind, device, steps=5, clip=None):
    opt = opt_fn(model.parameters())
    losses = []
    compiles = []
    for i in range(steps):
        x, y, t = data(kind, seed=i)
        x, y, t = x.to(device), y.to(device), t.to(device)
        opt.zero_grad()
        out = model(x)
        loss = F.cross_entropy(out, y) if loss_kind == "ce" else F.mse_loss(out, t)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if device == DEV:
            lazyxla.sync()
            compiles.append(met.counter_value("UncachedCompile") or 0)
        losses.append(loss.item())
    return losses, compiles


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("opt", sorted(OPTS))
@pytest.mark.parametrize("loss_kind", ["ce", "mse"])
def test_matches_eager(kind, opt, loss_kind):
    torch.manual_seed(1)
    ref = mlp() if kind == "mlp" else cnn()
    lz = copy.deepcopy(ref).to(DEV)
    clip = 0.5 if opt == "sgd" else None
    want, _ = train(ref, OPTS[opt], kind, loss_kind, "cpu", clip=clip)
    got, compiles = train(lz, OPTS[opt], kind, loss_kind, DEV, clip=clip)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-6)
    for p_ref, p_lz in zip(ref.parameters(), lz.parameters()):
        torch.testing.assert_close(p_lz.detach().cpu(), p_ref.detach(), rtol=1e-4, atol=1e-5)
    # a warm loop stops compiling: the last steps add no UncachedCompile
    assert compiles[-1] == compiles[2], compiles


def test_parameters_stay_on_device_and_are_lazy_tensors():
    m = mlp().to(DEV)
    for p in m.parameters():
        assert p.device == DEV and isinstance(p, lazyxla.LazyTensor) and p.requires_grad


def test_float64_and_int64_train_values_stay_64_bit():
    needs_wide_int64()
    torch.manual_seed(0)
    ref = nn.Linear(4, 3).double()
    lz = copy.deepcopy(ref).to(DEV)
    x = torch.randn(6, 4, dtype=torch.float64)
    want = ref(x).sum()
    got = lz(x.to(DEV)).sum()
    assert got.dtype == torch.float64
    torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-12, atol=1e-12)
    big = torch.tensor([2 ** 40 + 3, -(2 ** 41) - 1], dtype=torch.int64)
    assert ((big.to(DEV) * 3) + 1).cpu().tolist() == ((big * 3) + 1).tolist()
