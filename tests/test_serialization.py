"""Saving, loading and copying lazy models.

``torch.save(model.state_dict())`` from the lazy device reads the values once;
``torch.load`` (weights_only=True, the default) brings them back onto the lazy device, and
``load_state_dict`` puts them into a lazy (or CPU) model. ``copy.deepcopy`` of a lazy model
gives an independent model with equal values. Optimizer state round-trips too, so a
resumed run continues exactly like an uninterrupted one.
"""
from __future__ import annotations

import copy
import gc
import io
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazyxla

DEV = lazyxla.device()

pytestmark = pytest.mark.usefixtures("nothing_pending")


def net():
    return nn.Sequential(nn.Conv2d(1, 3, 3, padding=1, bias=False), nn.BatchNorm2d(3), nn.ReLU(),
                         nn.Flatten(), nn.Linear(3 * 4 * 4, 4))


def batch(i):
    g = torch.Generator().manual_seed(i)
    return torch.randn(6, 1, 4, 4, generator=g), torch.randint(0, 4, (6,), generator=g)


def step(model, opt, i, device):
    x, y = batch(i)
    opt.zero_grad()
    loss = F.cross_entropy(model(x.to(device)), y.to(device))
    loss.backward()
    opt.step()
    if device == DEV:
        lazyxla.sync()
    return loss.item()


def roundtrip(obj, **load_kw):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kw)


def assert_same_state(a: nn.Module, b: nn.Module):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype, k
        torch.testing.assert_close(sa[k].detach().cpu(), sb[k].detach().cpu(), rtol=0, atol=0, msg=k)


# ---------------------------------------------------------------------------------------
def test_state_dict_save_load_into_a_lazy_model():
    torch.manual_seed(0)
    src = net().to(DEV)
    opt = torch.optim.SGD(src.parameters(), lr=0.1)
    step(src, opt, 0, DEV)  # values are device data, buffers moved
    state = roundtrip(src.state_dict())  # weights_only=True by default
    for k, v in state.items():
        assert v.device == DEV, k
    assert state["1.num_batches_tracked"].dtype == torch.int64 and state["1.num_batches_tracked"].item() == 1
    torch.manual_seed(1)
    dst = net().to(DEV)
    dst.load_state_dict(state)
    assert_same_state(dst, src)
    x, _ = batch(5)
    src.eval()
    dst.eval()
    torch.testing.assert_close(dst(x.to(DEV)).detach().cpu(), src(x.to(DEV)).detach().cpu(), rtol=0, atol=0)


def test_state_dict_with_pending_values_saves_the_current_values():
    torch.manual_seed(0)
    src = net().to(DEV)
    with torch.no_grad():
        src[4].weight.mul_(2)  # pending, not synced
        src[4].bias[1:3] = 7.0  # through a view
    want = {k: v.detach().cpu().clone() for k, v in src.state_dict().items()}
    state = roundtrip(src.state_dict())
    for k in want:
        torch.testing.assert_close(state[k].cpu(), want[k], rtol=0, atol=0, msg=k)
    assert state["4.bias"][1:3].cpu().tolist() == [7.0, 7.0]


def test_state_dict_file_loads_into_a_cpu_model(tmp_path):
    torch.manual_seed(0)
    src = net().to(DEV)
    path = tmp_path / "model.pt"
    torch.save(src.state_dict(), path)
    cpu_model = net()
    cpu_model.load_state_dict(torch.load(path))
    for p in cpu_model.parameters():
        assert p.device.type == "cpu"
    assert_same_state(cpu_model, src)


def test_tensors_of_every_dtype_and_views_round_trip():
    ts = {
        "f32": torch.randn(3, 4), "f64": torch.randn(2, dtype=torch.float64),
        "bf16": torch.randn(5).to(torch.bfloat16), "f16": torch.randn(5).to(torch.float16),
        "i64": torch.tensor([2 ** 62 + 1, -5]), "i32": torch.tensor([7, -8], dtype=torch.int32),
        "u8": torch.tensor([0, 255], dtype=torch.uint8), "bool": torch.tensor([True, False]),
    }
    lazy = {k: v.to(DEV) for k, v in ts.items()}
    lazy["view"] = lazy["f32"][1:, ::2]
    lazy["param"] = nn.Parameter(torch.ones(2, device=DEV))
    back = roundtrip(lazy)
    for k, v in ts.items():
        assert back[k].device == DEV and back[k].dtype == v.dtype, k
        torch.testing.assert_close(back[k].cpu(), v, rtol=0, atol=0, msg=k)
    torch.testing.assert_close(back["view"].cpu(), ts["f32"][1:, ::2], rtol=0, atol=0)
    assert back["param"].requires_grad


def test_optimizer_state_round_trip_resumes_exactly():
    torch.manual_seed(0)
    ref = net().to(DEV)
    model = copy.deepcopy(ref)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    want = [step(ref, ref_opt, i, DEV) for i in range(4)]

    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    got = [step(model, opt, i, DEV) for i in range(2)]
    saved = roundtrip({"model": model.state_dict(), "opt": opt.state_dict()})
    torch.manual_seed(3)
    resumed = net().to(DEV)
    resumed.load_state_dict(saved["model"])
    ropt = torch.optim.Adam(resumed.parameters(), lr=1e-2)
    ropt.load_state_dict(saved["opt"])
    got += [step(resumed, ropt, i, DEV) for i in range(2, 4)]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-6, atol=1e-7)
    assert_same_state(resumed, ref)


# ---------------------------------------------------------------------------------------
def test_deepcopy_gives_an_independent_model_with_equal_values():
    torch.manual_seed(0)
    a = net().to(DEV)
    opt = torch.optim.SGD(a.parameters(), lr=0.1)
    step(a, opt, 0, DEV)
    b = copy.deepcopy(a)
    assert_same_state(b, a)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert pa is not pb and pb.device == DEV and pb.requires_grad and pb.is_leaf
    before = {k: v.detach().cpu().clone() for k, v in a.state_dict().items()}
    # train the copy: the original does not move
    bopt = torch.optim.SGD(b.parameters(), lr=0.1)
    step(b, bopt, 1, DEV)
    with torch.no_grad():
        b[4].bias.fill_(3.0)
    lazyxla.sync()
    for k, v in a.state_dict().items():
        torch.testing.assert_close(v.detach().cpu(), before[k], rtol=0, atol=0, msg=k)
    assert b[4].bias.detach().cpu().tolist() == [3.0] * 4
    # and the other way around
    with torch.no_grad():
        a[0].weight.zero_()
    lazyxla.sync()
    assert b[0].weight.detach().abs().sum().item() > 0


def test_deepcopy_of_pending_values_and_shared_parameters():
    torch.manual_seed(0)
    lin = nn.Linear(3, 3)
    m = nn.Sequential(lin, nn.Tanh(), lin).to(DEV)  # the same module twice
    with torch.no_grad():
        m[0].weight.add_(1.0)  # pending
    c = copy.deepcopy(m)
    assert c[0] is c[2] and c[0].weight is c[2].weight
    torch.testing.assert_close(c[0].weight.detach().cpu(), m[0].weight.detach().cpu(), rtol=0, atol=0)
    with torch.no_grad():
        m[0].weight.add_(1.0)
    lazyxla.sync()
    torch.testing.assert_close(c[0].weight.detach().cpu() + 1, m[0].weight.detach().cpu(), rtol=0, atol=0)


def test_deepcopy_then_train_matches_training_the_original():
    torch.manual_seed(0)
    a = net().to(DEV)
    b = copy.deepcopy(a)
    oa = torch.optim.SGD(a.parameters(), lr=0.05, momentum=0.9)
    ob = torch.optim.SGD(b.parameters(), lr=0.05, momentum=0.9)
    la = [step(a, oa, i, DEV) for i in range(3)]
    lb = [step(b, ob, i, DEV) for i in range(3)]
    assert la == lb
    assert_same_state(a, b)
