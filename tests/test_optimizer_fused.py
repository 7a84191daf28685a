"""Adam and AdamW left to their default step fused on the lazy device: one node for every
parameter instead of about twelve traced ops each, eager's values, and a choice the user made
kept."""
import pytest
import torch
import torch.nn as nn

import lazyxla
from lazyxla.optim import fused as optimizer_fused
from lazyxla.keys.collect import Graph
from lazyxla.run.storage import pending
from lazyhelp import cnt, train

DEV = lazyxla.device()
pytestmark = pytest.mark.usefixtures("nothing_pending")


def run(make_opt, dev, steps=4):
    losses, _, model, opt = train(make_opt, 7, steps, dev)
    return losses, opt, [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("kind", [torch.optim.Adam, torch.optim.AdamW], ids=lambda k: k.__name__)
@pytest.mark.parametrize("kw", [{}, {"amsgrad": True}, {"maximize": True}], ids=["plain", "amsgrad", "maximize"])
def test_a_default_adam_steps_fused_with_eagers_values(kind, kw):
    make = lambda p: kind(p, lr=1e-2, weight_decay=0.05, **kw)  # noqa: E731
    want, _, want_params = run(make, "cpu")
    before = cnt("OptimizerFusedByDefault")
    got, opt, got_params = run(make, DEV)
    assert cnt("OptimizerFusedByDefault") - before == 1
    assert opt.param_groups[0]["fused"] is True
    assert all(s["step"].device == DEV for s in opt.state.values())  # the fused kernel's state
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for g, w in zip(got_params, want_params):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_the_fused_step_traces_one_op_for_all_parameters_where_foreach_traces_several_each():
    def traced(make):
        torch.manual_seed(0)
        model = nn.Linear(5, 4).to(DEV)
        opt = make(model.parameters())
        for _ in range(2):
            model(torch.ones(2, 5).to(DEV)).sum().backward()
            lazyxla.sync()
            n = _pending_ops(opt.step)
            opt.zero_grad()
            lazyxla.sync()
        return n

    fused = traced(lambda p: torch.optim.AdamW(p, lr=1e-2))
    assert fused.count("aten::_fused_adamw_") == 1 and len(fused) <= 6  # and each step count's += 1
    assert len(traced(lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True))) >= 3 * len(fused)


def _pending_ops(step):
    """The ops ``step`` records (the graph of everything pending after it; nothing was before)."""
    step()
    _, roots = pending()
    return [n.sig.op for n in Graph([r for _, r in roots]).post if n.data is None]


@pytest.mark.parametrize("kw", [{"foreach": True}, {"foreach": False}, {"fused": False}, {"lr": torch.tensor(0.01)}],
                         ids=["foreach", "for-loop", "not fused", "tensor lr"])
def test_a_choice_the_user_made_is_kept(kw):
    before = cnt("OptimizerFusedByDefault")
    _, opt, _ = run(lambda p: torch.optim.AdamW(p, **{"lr": 1e-2, **kw}), DEV, steps=1)
    assert cnt("OptimizerFusedByDefault") == before and not opt.param_groups[0]["fused"]


def test_off_and_on_the_cpu_nothing_changes(monkeypatch):
    _, opt, _ = run(lambda p: torch.optim.AdamW(p, lr=1e-2), "cpu", steps=1)
    assert opt.param_groups[0]["fused"] is None
    monkeypatch.setattr(optimizer_fused, "ENABLED", False)
    _, opt, _ = run(lambda p: torch.optim.AdamW(p, lr=1e-2), DEV, steps=1)
    assert opt.param_groups[0]["fused"] is None


def test_a_fused_step_updates_parameters_and_moments_in_place_without_copies():
    """Each parameter and moment is written over its own donated buffer: the program keeps no
    copy of any (a moment read through a reshape once made XLA copy every one: a step held
    temporaries as large as the moments)."""
    from lazyxla.compiler.cache import computation_cache

    torch.manual_seed(0)
    dev = lazyxla.device()
    model = nn.Linear(512, 512).to(dev)  # its weight read by the forward pass and its own gradient only
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        model(torch.randn(8, 512).to(dev)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        lazyxla.sync()
    exe = computation_cache().values()[-1].executable
    temp = exe.memory_analysis().temp_size_in_bytes
    weights = sum(p.numel() * 4 for p in model.parameters())
    # the gradient (zero_grad sets it to None: a temporary) and nothing more; with copies of the
    # two moments it was three times the weights
    assert temp < 1.2 * weights, (temp, weights)
