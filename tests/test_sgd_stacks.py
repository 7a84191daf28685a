"""SGD on the lazy device steps fused, its alike parameters, momentum buffers and gradients kept
as rows of one stack each (``param_stacks``, ``optimizer_sgd``, issue 52): what a user sees is
eager PyTorch's (losses, parameters, ``.grad`` read after a step or a replay, ``opt.state``),
through lazy steps and ``lazyxla.compile(step, replay=True)``, with every SGD setting, a frozen
parameter and gradients kept between steps; one program; a replay passes one buffer per stack."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazyxla
from lazyxla.optim import param_stacks
from lazyhelp import cnt

DEV = lazyxla.device()
pytestmark = pytest.mark.usefixtures("nothing_pending")
DEPTH, WIDTH = 9, 8  # 9 alike weights and biases: SGD stacks from param_stacks.SGD_MIN_ROWS (8) on


def mlp(dev, depth=DEPTH):
    torch.manual_seed(0)
    layers = [nn.Linear(WIDTH, WIDTH)]
    for _ in range(depth - 1):
        layers += [nn.Tanh(), nn.Linear(WIDTH, WIDTH)]
    return nn.Sequential(*layers).to(dev)


def batch(dev):
    g = torch.Generator().manual_seed(1)
    return torch.randn(5, WIDTH, generator=g).to(dev), torch.randint(0, WIDTH, (5,), generator=g).to(dev)


def step(model, opt, x, y, set_to_none=True):
    opt.zero_grad(set_to_none=set_to_none)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def run(dev, make_opt, steps=5, replay=False, freeze=None, set_to_none=True, depth=DEPTH):
    """Train ``steps`` steps; per step the loss and every ``.grad`` as read after it (None for
    none), then the model and the optimizer."""
    model = mlp(dev, depth)
    if freeze is not None:
        freeze(model)
    opt = make_opt(model.parameters())
    x, y = batch(dev)
    fn = lambda x, y: step(model, opt, x, y, set_to_none)  # noqa: E731
    if replay:
        fn = lazyxla.compile(fn, replay=True)
    seen = []
    for _ in range(steps):
        loss = fn(x, y)
        if dev != "cpu" and not replay:
            lazyxla.sync()
        seen.append((float(loss), [None if p.grad is None else p.grad.detach().cpu().clone()
                                   for p in model.parameters()]))
    return seen, model, opt


def same(got, want):
    (gs, gm, gopt), (ws, wm, wopt) = got, want
    for i, ((gl, gg), (wl, wg)) in enumerate(zip(gs, ws)):
        assert gl == pytest.approx(wl, rel=1e-5, abs=1e-6), f"loss of step {i}"
        for k, (a, b) in enumerate(zip(gg, wg)):
            assert (a is None) == (b is None), f"step {i}: .grad of parameter {k}"
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"step {i}: .grad of parameter {k}")
    for (n, pg), pw in zip(gm.named_parameters(), wm.parameters()):
        torch.testing.assert_close(pg.detach().cpu(), pw.detach(), rtol=1e-5, atol=1e-6, msg=n)
    for pg, pw in zip(gm.parameters(), wm.parameters()):
        bg, bw = gopt.state.get(pg, {}).get("momentum_buffer"), wopt.state.get(pw, {}).get("momentum_buffer")
        assert (bg is None) == (bw is None)
        if bg is not None:
            torch.testing.assert_close(bg.cpu(), bw, rtol=1e-5, atol=1e-6)


SETTINGS = {
    "momentum": dict(lr=0.1, momentum=0.9),
    "dampening-weight-decay": dict(lr=0.1, momentum=0.8, dampening=0.3, weight_decay=0.01),
    "nesterov-maximize": dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.02, maximize=True),
    "no-momentum": dict(lr=0.1),
}


@pytest.mark.parametrize("replay", [False, True], ids=["lazy", "replayed"])
@pytest.mark.parametrize("kw", list(SETTINGS.values()), ids=list(SETTINGS))
def test_sgd_trains_as_eager_with_its_parameters_buffers_and_gradients_stacked(kw, replay):
    make = lambda p: torch.optim.SGD(p, **kw)  # noqa: E731
    want = run("cpu", make)
    fused, stacked, grads = cnt("OptimizerFusedByDefault"), cnt("ParamsStacked"), cnt("GradsStacked")
    got = run(DEV, make, replay=replay)
    same(got, want)
    assert cnt("OptimizerFusedByDefault") - fused == 1
    assert cnt("ParamsStacked") - stacked == 2 * DEPTH  # every weight and every bias: two stacks
    assert cnt("GradsStacked") - grads >= 2 * DEPTH  # each step's new gradients, made rows of a stack
    assert all(type(p) is nn.Parameter or isinstance(p, nn.Parameter) for p in got[1].parameters())


def test_a_replayed_step_passes_one_buffer_per_stack_and_compiles_once():
    compiles = cnt("UncachedCompile")
    model = mlp(DEV, depth=11)  # a depth of its own: a program no other test compiled
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = batch(DEV)
    fn = lazyxla.compile(lambda x, y: step(model, opt, x, y), replay=True)
    losses = [float(fn(x, y)) for _ in range(5)]
    assert cnt("UncachedCompile") - compiles == 1  # the lazy step's program is the one replayed
    want_model = mlp("cpu", depth=11)
    want_opt = torch.optim.SGD(want_model.parameters(), lr=0.1, momentum=0.9)
    want = [float(step(want_model, want_opt, *batch("cpu"))) for _ in range(5)]
    assert losses == pytest.approx(want, rel=1e-5, abs=1e-6)
    b = next(iter(fn._sigs.values())).binding
    # the program's inputs: the weights' and biases' stacks and their buffers' stacks, x, y, lr
    # and 1 - dampening; its outputs: those four stacks, the two gradients' stacks and the loss
    assert (len(b.template), b.n_out) == (9, 7)  # the momentum among them: data


def test_a_frozen_parameter_and_one_frozen_after_the_optimizer_was_built_are_eagers():
    def before(model):
        model[0].weight.requires_grad_(False)  # left out of the stack: the other 8 weights stack

    want = run("cpu", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), freeze=before)
    got = run(DEV, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), freeze=before, replay=True)
    same(got, want)

    def later(opt_params):
        ps = list(opt_params)
        opt = torch.optim.SGD(ps, lr=0.1, momentum=0.9)
        ps[4].requires_grad_(False)  # a row of the weights' stack with no gradient: stepped one by one
        return opt

    want = run("cpu", later)
    got = run(DEV, later, replay=True)
    same(got, want)


@pytest.mark.parametrize("replay", [False, True], ids=["lazy", "replayed"])
def test_gradients_kept_between_steps_accumulate_as_eagers(replay):
    make = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01)  # noqa: E731
    want = run("cpu", make, set_to_none=False)
    got = run(DEV, make, set_to_none=False, replay=replay)
    same(got, want)


def test_gradients_are_rows_a_user_reads_writes_and_tells_apart():
    seen, model, opt = run(DEV, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), steps=2)
    ws = [m.weight for m in model if isinstance(m, nn.Linear)]
    ptrs = {w.grad.data_ptr() for w in ws}
    assert len(ptrs) == len(ws)  # each gradient a storage of its own to code comparing storages
    before = ws[3].grad.cpu().clone()
    ws[3].grad.mul_(2)  # a write to one row reaches that gradient only
    torch.testing.assert_close(ws[3].grad.cpu(), 2 * before)
    torch.testing.assert_close(ws[2].grad.cpu(), seen[-1][1][4])  # parameters: weight, bias, ...


def test_off_nothing_is_stacked(monkeypatch):
    monkeypatch.setattr(param_stacks, "ENABLED", False)
    stacked, grads = cnt("ParamsStacked"), cnt("GradsStacked")
    make = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
    same(run(DEV, make, replay=True), run("cpu", make))
    assert cnt("ParamsStacked") == stacked and cnt("GradsStacked") == grads


def test_a_foreach_sgd_the_user_asked_for_is_kept():
    seen, model, opt = run(DEV, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True), steps=2)
    assert opt.param_groups[0]["fused"] is None
    same((seen, model, opt), run("cpu", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), steps=2))
