"""Issue 31, part 1: an optimizer made before its model moved to the device trains, or says why not.

``model.to(lazyxla.device())`` puts new Parameters in the model (as torch_xla's device does); an
optimizer holding the old CPU ones would update tensors nobody uses and the loop would learn
nothing. The optimizer follows the moved parameters as they move (groups and state), or at its
first ``step()`` when it was made later from the old ones; or that step raises naming them. The accelerate forms users write run in new processes against eager.
"""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazyxla
from lazyxla.frontend import param_moves
from lazyhelp import cnt

DEV = lazyxla.device()
VARIANTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_scripts", "accelerate_variants.py")


def net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def batches(n=4):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)) for _ in range(n)]


def train(model, opt, device, data):
    losses = []
    for x, y in data:
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("make", ["sgd", "adamw"])
def test_an_optimizer_made_before_the_move_trains_like_eager(make):
    mk = {"sgd": lambda p: torch.optim.SGD(p, lr=0.3, momentum=0.9), "adamw": lambda p: torch.optim.AdamW(p, 1e-2)}[make]
    ref = net()
    want = train(ref, mk(ref.parameters()), "cpu", batches())
    model = net()
    opt = mk(model.parameters())     # before the move: holds the CPU parameters
    before = cnt("MovedParameterFollowed")
    model.to(DEV)
    got = train(model, opt, DEV, batches())
    assert got == pytest.approx(want, rel=1e-5)
    assert all(a is b for a, b in zip(opt.param_groups[0]["params"], model.parameters()))
    assert cnt("MovedParameterFollowed") - before == 4
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-5, atol=1e-6)


def test_the_optimizer_holds_the_new_parameters_right_after_the_move():
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.to(DEV)
    held = opt.param_groups[0]["params"]
    assert all(a is b for a, b in zip(held, model.parameters())) and held[0].device == DEV
    x, y = batches(1)[0]
    F.cross_entropy(model(x.to(DEV)), y.to(DEV)).backward()
    # a clip over the optimizer's own parameters, before its first step, sees the gradients
    norm = torch.nn.utils.clip_grad_norm_(held, 1e-3)
    assert norm.item() > 1e-3


def test_state_from_a_cpu_step_moves_with_the_parameters():
    data = batches(4)
    ref = net()
    ropt = torch.optim.AdamW(ref.parameters(), 1e-2)
    want = train(ref, ropt, "cpu", data)
    model = net()
    opt = torch.optim.AdamW(model.parameters(), 1e-2)
    train(model, opt, "cpu", data[:2])        # two steps on the CPU: state made there
    model.to(DEV)
    got = train(model, opt, DEV, data[2:])
    assert got == pytest.approx(want[2:], rel=1e-5)
    st = opt.state[next(model.parameters())]
    assert st["exp_avg"].device == DEV and float(st["step"]) == 4.0


def test_a_move_back_to_the_cpu_is_followed_too():
    model = net().to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    train(model, opt, DEV, batches(1))
    model.cpu()
    train(model, opt, "cpu", batches(1))
    assert opt.param_groups[0]["params"][0] is next(model.parameters())
    assert opt.param_groups[0]["params"][0].device.type == "cpu"


def test_parameters_whose_replacements_are_gone_make_the_step_raise_naming_them():
    model = net()
    cpu_params = list(model.parameters())
    model.to(DEV)
    model[0] = nn.Linear(6, 8)      # the moved layers dropped: the new parameters are gone
    model[2] = nn.Linear(8, 3)
    opt = torch.optim.SGD(cpu_params, lr=0.1)   # an optimizer of what the model held before
    with pytest.raises(lazyxla.LazyXlaError) as e:
        opt.step()
    msg = str(e.value)
    assert "SGD.step()" in msg and "0.weight (cpu)" in msg and "2.bias (cpu)" in msg
    assert "after moving the model" in msg


def test_nothing_is_watched_once_the_old_parameters_are_gone():
    import gc
    gc.collect()
    model = net()
    model.to(DEV)                    # nobody held the CPU parameters: nothing to follow
    new = {id(p) for p in model.parameters()}
    assert not any(id(q()) in new for _, q, _ in param_moves.MOVED.values())
    if not param_moves.MOVED:        # no other test's old parameters still alive
        assert param_moves._hook[0] is None


def test_tied_weights_stay_tied_and_the_optimizer_follows_the_one_parameter():
    emb = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = nn.Sequential(emb, head)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.to(DEV)
    assert model[0].weight is model[1].weight
    loss = model(torch.tensor([1, 2, 3]).to(DEV)).sum()
    loss.backward()
    opt.step()
    assert opt.param_groups[0]["params"] == [model[0].weight]


def _result(cmd, out, **env):
    e = dict(os.environ, TOKENIZERS_PARALLELISM="false", **env)
    p = subprocess.run(cmd + [out], capture_output=True, text=True, timeout=600, env=e)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, p.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


FORMS = ["issue", "accelerator_first", "separate_calls", "optimizer_first", "user_moves_model", "sgd"]


@pytest.fixture(scope="module")
def variant_runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("variants")
    # every form in one process (accelerate's state reset before each), eager's two in another
    runs = _result([sys.executable, "-m", "lazyxla", "run", VARIANTS], str(d / "lazy"), VARIANTS=",".join(FORMS))
    eager = _result([sys.executable, VARIANTS], str(d / "eager"), VARIANTS="issue,sgd")
    runs.update({"eager-" + k: v for k, v in eager.items()})
    return runs


@pytest.mark.parametrize("variant", FORMS)
def test_every_form_of_an_accelerate_loop_trains_like_eager(variant_runs, variant):
    got = variant_runs[variant]
    want = variant_runs["eager-sgd" if variant == "sgd" else "eager-issue"]
    assert got["param_device"] == got["model_device"] == "lazyxla:0"
    assert got["same_objects"] and got["with_state"] == want["with_state"]
    assert got["losses"] == pytest.approx(want["losses"], rel=1e-4)
    assert len(set(got["losses"])) > 1
