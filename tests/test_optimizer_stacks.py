"""The fused Adam/AdamW step of a model with alike layers: the moments of same-shaped parameters
stacked (``optimizer_stacks``), the step counts kept on the host (``optimizer_counts``), eager's
values throughout, one program, and what a user does with the state (reads, writes, a state
dict, a capture) still right."""
import pytest
import torch
import torch.nn as nn

import lazyxla
from lazyxla.optim import counts as optimizer_counts, adam as optimizer_stacks
from lazyhelp import cnt, lazy_then_replayed, torch_compiled_losses

DEV = lazyxla.device()
pytestmark = pytest.mark.usefixtures("nothing_pending")


@pytest.fixture(autouse=True)
def small_groups_stack(monkeypatch):
    """The model here has three alike layers: its groups are stacked as a deep model's are."""
    monkeypatch.setattr(optimizer_stacks, "MIN_ROWS", 2)


def model_on(dev, depth=3):
    torch.manual_seed(0)
    blocks = [m for _ in range(depth) for m in (nn.Linear(6, 6), nn.Tanh())]
    return nn.Sequential(*blocks, nn.Linear(6, 2)).to(dev)


def run(dev, make_opt, steps=4, between=None, scaler_bad=None):
    model = model_on(dev)
    opt = make_opt(model.parameters())
    scaler = None
    if scaler_bad is not None:
        scaler = torch.amp.GradScaler("cpu" if dev == "cpu" else "lazyxla", init_scale=2.0 ** 8)
    x = torch.randn(4, 6)
    losses = []
    for i in range(steps):
        xi = x.clone()
        if scaler_bad is not None and scaler_bad[i]:
            xi[0, 0] = float("inf")
        loss = model(xi.to(dev)).pow(2).mean()
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        opt.zero_grad()
        if dev != "cpu":
            lazyxla.sync()
        losses.append(float(loss))
        if between is not None:
            between(i, model, opt)
    return losses, model, opt


def close(got, want):
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def same_state(got_opt, got_model, want_opt, want_model):
    for pg, pw in zip(got_model.parameters(), want_model.parameters()):
        close(pg.detach().cpu(), pw.detach())
        sg, sw = got_opt.state[pg], want_opt.state[pw]
        for k in sw:
            close(sg[k].cpu(), sw[k])


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1),  # L2: the gradient takes the parameter
    lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True),
    lambda p: torch.optim.AdamW(p, lr=1e-2, maximize=True),
], ids=["adamw", "adam-l2", "amsgrad", "maximize"])
def test_alike_layers_step_with_stacked_moments_and_eagers_values_in_one_program(make):
    want_losses, want_model, want_opt = run("cpu", make)
    stacked, counts, compiles = cnt("MomentsStacked"), cnt("HostStepCount"), cnt("UncachedCompile")
    got_losses, got_model, got_opt = run(DEV, make)
    n_moments = 3 if got_opt.param_groups[0]["amsgrad"] else 2
    assert cnt("MomentsStacked") - stacked == n_moments * 6  # 3 weights and 3 biases alike, once
    assert cnt("HostStepCount") - counts == 8 * 4  # every parameter's count, every step
    assert cnt("UncachedCompile") - compiles == 1  # the first step is the steady one
    close(got_losses, want_losses)
    same_state(got_opt, got_model, want_opt, want_model)
    assert [float(s["step"]) for s in got_opt.state.values()] == [4.0] * 8


def test_a_gradient_scalers_skipped_steps_skip_the_stacked_moments_too():
    bad = [False, True, False, False]
    make = lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True)  # noqa: E731
    want_losses, want_model, want_opt = run("cpu", make, scaler_bad=bad)
    got_losses, got_model, got_opt = run(DEV, make, scaler_bad=bad)
    close(got_losses[:1] + got_losses[2:], want_losses[:1] + want_losses[2:])
    same_state(got_opt, got_model, want_opt, want_model)


def test_the_users_writes_to_a_stacked_moment_and_reads_of_it_are_eagers():
    def poke(i, model, opt):
        if i == 1:
            p = model[2].weight
            opt.state[p]["exp_avg"].mul_(0.5)  # a write through a row of the stack
            opt.state[p]["exp_avg_sq"][0].zero_()  # a write through a view of a row

    make = lambda p: torch.optim.AdamW(p, lr=1e-2)  # noqa: E731
    _, want_model, want_opt = run("cpu", make, between=poke)
    _, got_model, got_opt = run(DEV, make, between=poke)
    same_state(got_opt, got_model, want_opt, want_model)


def test_a_state_dict_round_trip_resumes_exactly():
    make = lambda p: torch.optim.AdamW(p, lr=1e-2)  # noqa: E731
    _, want_model, want_opt = run("cpu", make, steps=5)
    _, model, opt = run(DEV, make, steps=2)
    saved = opt.state_dict()
    fresh = make(model.parameters())
    fresh.load_state_dict(saved)
    model_on("cpu")
    x = torch.randn(4, 6)  # run()'s input
    for _ in range(3):
        model(x.to(DEV)).pow(2).mean().backward()
        fresh.step()
        fresh.zero_grad()
        lazyxla.sync()
    same_state(fresh, model, want_opt, want_model)


def test_lazy_steps_then_replayed_steps_count_and_update_like_eager():
    _, want_model, want_opt = run("cpu", lambda p: torch.optim.AdamW(p, lr=1e-2), steps=6)
    model = model_on(DEV)
    x = torch.randn(4, 6).to(DEV)  # run()'s input
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)
    lazy_then_replayed(model, opt, x)
    same_state(opt, model, want_opt, want_model)


def test_off_the_moments_stay_apart_and_the_counts_on_the_device(monkeypatch):
    make = lambda p: torch.optim.AdamW(p, lr=1e-2)  # noqa: E731
    _, want_model, want_opt = run("cpu", make)
    monkeypatch.setattr(optimizer_stacks, "ENABLED", False)
    monkeypatch.setattr(optimizer_counts, "ENABLED", False)
    stacked, counts = cnt("MomentsStacked"), cnt("HostStepCount")
    _, got_model, got_opt = run(DEV, make)
    assert cnt("MomentsStacked") == stacked and cnt("HostStepCount") == counts
    same_state(got_opt, got_model, want_opt, want_model)


def test_scan_layers_gradients_enter_stacked_and_train_like_eagers_loop(monkeypatch):
    monkeypatch.setattr(optimizer_stacks, "MIN_ROWS", 16)  # the default: scan_layers' groups stack anyway

    def layers_on(dev):
        torch.manual_seed(0)
        return nn.ModuleList([nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8), nn.GELU()) for _ in range(4)]).to(dev)

    x = torch.randn(3, 8)
    want = layers_on("cpu")
    want_opt = torch.optim.AdamW(want.parameters(), lr=1e-2)
    for _ in range(3):
        h = x
        for layer in want:
            h = layer(h)
        h.pow(2).mean().backward()
        want_opt.step()
        want_opt.zero_grad()
    got = layers_on(DEV)
    opt = torch.optim.AdamW(got.parameters(), lr=1e-2)
    stacked, compiles = cnt("MomentsStacked"), cnt("UncachedCompile")
    for _ in range(3):
        lazyxla.scan_layers(got, x.to(DEV)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        lazyxla.sync()
    assert cnt("MomentsStacked") - stacked == 2 * 4 * 4  # 2 moments of 4 parameters in each of 4 layers
    assert cnt("UncachedCompile") - compiles == 1
    same_state(opt, got, want_opt, want)


def test_a_torch_compiled_step_counts_and_updates_like_eager():
    def compiled(dev):
        model = model_on(dev)
        x = torch.randn(4, 6).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        return torch_compiled_losses(model, opt, x), model, opt

    torch._dynamo.reset()
    want_losses, want_model, want_opt = compiled("cpu")
    got_losses, got_model, got_opt = compiled(DEV)
    close(got_losses, want_losses)
    same_state(got_opt, got_model, want_opt, want_model)
    assert [float(s["step"]) for s in got_opt.state.values()] == [4.0] * 8
