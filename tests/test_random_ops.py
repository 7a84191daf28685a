"""Random ops draw from lazyxla's seed graph.

rand, randn, randint, dropout, bernoulli_, normal_, uniform_, randperm, multinomial and
friends: the same ``lazyxla.manual_seed`` gives the same numbers, a new seed gives new
numbers without compiling anything, no op runs on the CPU (where PyTorch's own generator,
not lazyxla's seed, would decide), and the numbers have the right distribution.
"""
from __future__ import annotations

import gc
import math
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazyxla
from lazyhelp import cnt
import lazyxla.debug.metrics as met

DEV = lazyxla.device()

pytestmark = pytest.mark.usefixtures("nothing_pending")
N = 4000


def _empty(dtype=torch.float32):
    return torch.empty(N, device=DEV, dtype=dtype)


PROBS = torch.tensor([0.1, 0.0, 0.2, 0.15, 0.05, 0.25, 0.1, 0.15])

# name -> (draw, fallback counter that must stay at zero)
OPS = {
    "rand": (lambda: torch.rand(N, device=DEV), "aten::rand"),
    "randn": (lambda: torch.randn(N, device=DEV), "aten::randn"),
    "randint": (lambda: torch.randint(3, 10, (N,), device=DEV), "aten::randint"),
    "randint_high": (lambda: torch.randint(7, (N,), device=DEV, dtype=torch.int32), "aten::randint"),
    "rand_like": (lambda: torch.rand_like(_empty()), "aten::rand_like"),
    "randn_like": (lambda: torch.randn_like(_empty(torch.float16)), "aten::randn_like"),
    "randint_like": (lambda: torch.randint_like(_empty(), 4), "aten::randint_like"),
    "dropout": (lambda: F.dropout(torch.ones(N, device=DEV), 0.3, training=True), "aten::native_dropout"),
    "bernoulli_": (lambda: _empty().bernoulli_(0.25), "aten::bernoulli_"),
    "bernoulli_tensor": (lambda: torch.bernoulli(torch.full((N,), 0.7, device=DEV)), "aten::bernoulli"),
    "normal_": (lambda: _empty().normal_(2.0, 3.0), "aten::normal_"),
    "normal": (lambda: torch.normal(torch.zeros(N, device=DEV), 3.0), "aten::normal_"),
    "uniform_": (lambda: _empty().uniform_(-2.0, 5.0), "aten::uniform_"),
    "exponential_": (lambda: _empty().exponential_(2.0), "aten::exponential_"),
    "random_": (lambda: _empty().random_(0, 5), "aten::random_"),
    "randperm": (lambda: torch.randperm(64, device=DEV), "aten::randperm"),
    "multinomial": (lambda: torch.multinomial(torch.tensor([0.1, 0.2, 0.7], device=DEV), N, replacement=True),
                    "aten::multinomial"),
    "multinomial_no_replacement": (lambda: torch.multinomial(PROBS.to(DEV), 5), "aten::multinomial"),
}


def draw(name, seed):
    lazyxla.manual_seed(seed)
    r = OPS[name][0]()
    lazyxla.sync()
    return r.cpu()


@pytest.mark.parametrize("name", sorted(OPS))
def test_seed_decides_the_numbers_and_never_recompiles(name):
    fb = OPS[name][1]
    f0 = cnt(fb)
    a = draw(name, 1234)
    b = draw(name, 1234)
    torch.testing.assert_close(a, b, rtol=0, atol=0)  # same seed, same numbers
    u = cnt("UncachedCompile")
    c = draw(name, 98765)
    assert cnt("UncachedCompile") == u, "a new seed must not compile"
    assert not torch.equal(a, c), "a new seed must give new numbers"
    assert cnt(fb) == f0, f"{name} ran on the CPU ({fb}): PyTorch's generator, not lazyxla's seed, drew it"


@pytest.mark.parametrize("name", sorted(OPS))
def test_successive_steps_draw_new_numbers(name):
    lazyxla.manual_seed(7)
    a = OPS[name][0]()
    lazyxla.sync()
    b = OPS[name][0]()
    lazyxla.sync()
    assert not torch.equal(a.cpu(), b.cpu())


def _mean_var(x):
    x = x.double()
    return x.mean().item(), x.var().item()


def _close(v, want, tol):
    assert abs(v - want) <= tol, (v, want, tol)


def test_distributions():
    lazyxla.manual_seed(2024)
    r = {name: OPS[name][0]() for name in OPS}
    lazyxla.sync()
    r = {k: v.cpu() for k, v in r.items()}
    se = 5 / math.sqrt(N)  # 5 standard errors of a unit-variance mean
    m, v = _mean_var(r["rand"])
    _close(m, 0.5, se * 0.3)
    _close(v, 1 / 12, 0.01)
    assert r["rand"].min() >= 0 and r["rand"].max() < 1 and r["rand"].dtype == torch.float32
    m, v = _mean_var(r["randn"])
    _close(m, 0.0, se)
    _close(v, 1.0, 0.1)
    assert r["randint"].dtype == torch.int64
    assert r["randint"].min() == 3 and r["randint"].max() == 9  # every value of [3, 10) shows up
    assert set(r["randint_high"].tolist()) == set(range(7)) and r["randint_high"].dtype == torch.int32
    assert set(r["randint_like"].tolist()) == {0.0, 1.0, 2.0, 3.0}
    _close(r["rand_like"].double().mean().item(), 0.5, se * 0.3)
    assert r["randn_like"].dtype == torch.float16
    _close(r["randn_like"].double().mean().item(), 0.0, se)
    d = r["dropout"]
    assert torch.isclose(d[d != 0], torch.tensor(1 / 0.7)).all()
    _close((d == 0).double().mean().item(), 0.3, 0.04)
    b = r["bernoulli_"]
    assert set(torch.unique(b).tolist()) <= {0.0, 1.0}
    _close(b.mean().item(), 0.25, 0.04)
    _close(r["bernoulli_tensor"].mean().item(), 0.7, 0.04)
    m, v = _mean_var(r["normal_"])
    _close(m, 2.0, 3 * se)
    _close(math.sqrt(v), 3.0, 0.2)
    m, v = _mean_var(r["normal"])
    _close(m, 0.0, 3 * se)
    _close(math.sqrt(v), 3.0, 0.2)
    u = r["uniform_"]
    assert u.min() >= -2.0 and u.max() < 5.0
    _close(u.mean().item(), 1.5, 7 * se * 0.3)
    e = r["exponential_"]
    assert e.min() >= 0
    _close(e.mean().item(), 0.5, 0.05)
    assert set(r["random_"].tolist()) == {0.0, 1.0, 2.0, 3.0, 4.0}
    assert sorted(r["randperm"].tolist()) == list(range(64)) and r["randperm"].dtype == torch.int64
    assert r["randperm"].tolist() != list(range(64))
    counts = torch.bincount(r["multinomial"], minlength=3).double() / N
    torch.testing.assert_close(counts, torch.tensor([0.1, 0.2, 0.7], dtype=torch.float64), atol=0.04, rtol=0)
    nr = r["multinomial_no_replacement"].tolist()
    assert len(set(nr)) == 5 and 1 not in nr  # distinct, never a zero-probability category


def test_two_random_ops_in_one_graph_are_independent():
    lazyxla.manual_seed(11)
    a = torch.rand(N, device=DEV)
    b = torch.rand(N, device=DEV)
    lazyxla.sync()
    a, b = a.cpu().double(), b.cpu().double()
    assert not torch.equal(a, b)
    corr = ((a - a.mean()) * (b - b.mean())).mean() / (a.std() * b.std())
    assert abs(corr.item()) < 0.06


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_random_dtypes(dtype):
    lazyxla.manual_seed(5)
    u = torch.rand(N, device=DEV, dtype=dtype)
    n = torch.randn(N, device=DEV, dtype=dtype)
    e = torch.empty(N, device=DEV, dtype=dtype).uniform_(1.0, 2.0)
    lazyxla.sync()
    assert u.dtype == n.dtype == e.dtype == dtype
    u, n, e = u.cpu().double(), n.cpu().double(), e.cpu().double()
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.03
    assert abs(n.mean()) < 0.1 and abs(n.std() - 1) < 0.1
    assert e.min() >= 1 and e.max() <= 2


def test_random_fill_through_a_view_touches_only_the_view():
    x = torch.zeros(4, 5, device=DEV)
    lazyxla.manual_seed(3)
    x[1:3].uniform_(10.0, 11.0)
    x[:, 4].normal_()
    host = x.cpu()
    assert (host[0, :4] == 0).all() and (host[3, :4] == 0).all()
    assert ((host[1:3, :4] >= 10) & (host[1:3, :4] < 11)).all()
    lazyxla.sync()
    torch.testing.assert_close(x.cpu(), host, rtol=0, atol=0)


def test_dropout_module_train_and_eval():
    drop = nn.Dropout(0.5)
    x = torch.ones(N, device=DEV)
    lazyxla.manual_seed(9)
    y = drop(x)
    drop.eval()
    z = drop(x)
    lazyxla.sync()
    y = y.cpu()
    assert set(torch.unique(y).tolist()) <= {0.0, 2.0}
    assert abs((y == 0).double().mean().item() - 0.5) < 0.04
    assert torch.equal(z.cpu(), torch.ones(N))


def test_dropout_mask_matches_its_gradient():
    lazyxla.manual_seed(21)
    x = torch.ones(64, device=DEV, requires_grad=True)
    y = F.dropout(x, 0.4, training=True)
    y.sum().backward()
    lazyxla.sync()
    torch.testing.assert_close(x.grad.cpu(), y.detach().cpu())


def test_module_init_on_the_device_follows_the_lazyxla_seed():
    """``nn.Linear(..., device=lazyxla)`` (kaiming_uniform_) and ``nn.Embedding`` (normal_)
    initialise from lazyxla's seed: the same seed gives the same weights."""
    def make(n):
        lazyxla.manual_seed(77)
        torch.rand(n)  # where PyTorch's CPU generator stands must not matter
        lin = nn.Linear(8, 4, device=DEV)
        emb = nn.Embedding(6, 3, device=DEV)
        lazyxla.sync()
        return lin.weight.detach().cpu(), emb.weight.detach().cpu()
    (w1, e1), (w2, e2) = make(0), make(1)
    assert torch.equal(w1, w2) and torch.equal(e1, e2)
    assert w1.abs().max() <= 1 / math.sqrt(8) + 1e-6
    lazyxla.manual_seed(78)
    lin = nn.Linear(8, 4, device=DEV)
    assert not torch.equal(lin.weight.detach().cpu(), w1)


def test_torch_manual_seed_also_seeds_the_lazy_device():
    """As for CUDA, ``torch.manual_seed`` seeds every device, lazyxla's included."""
    def run(seed):
        lazyxla.manual_seed(1)
        torch.manual_seed(seed)
        r = torch.randn(16, device=DEV)
        lazyxla.sync()
        return r.cpu()
    assert torch.equal(run(5), run(5))
    assert not torch.equal(run(5), run(6))
