"""A fused Adam/AdamW group's alike parameters kept as the rows of one stack (``param_stacks``):
the same Parameters and eager's values through training and what a user does to them (writes,
``.data =``, a state dict, a layer left out of a step), one program before the steady state, and
a rolled model's program whose parameters and outputs do not grow with depth."""
import re

import pytest
import torch
import torch.nn as nn

import lazyxla
from lazyxla.optim import param_stacks
from lazyxla import rolling
from lazyxla.rolling import settings as roll_settings
from lazyxla.compiler.cache import computation_cache
from lazyhelp import cnt, distinct_kernels, last_program_text, lazy_then_replayed, torch_compiled_losses

DEV = lazyxla.device()
pytestmark = pytest.mark.usefixtures("nothing_pending")


@pytest.fixture(autouse=True)
def small_groups_stack(monkeypatch):
    """Four alike layers: their roles are stacked as a deep model's are."""
    monkeypatch.setattr(roll_settings, "MIN_ITERATIONS", 4)
    monkeypatch.setattr(roll_settings, "WORK", "0")
    monkeypatch.setattr(roll_settings, "ENABLED", True)


def model_on(dev, depth=4, width=6):
    torch.manual_seed(0)
    blocks = [m for _ in range(depth) for m in (nn.Linear(width, width), nn.Tanh())]
    return nn.Sequential(nn.Linear(3, width), *blocks, nn.Linear(width, 2)).to(dev)


X = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))


def train(dev, steps=4, between=None, make=lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1), model=None):
    model = model if model is not None else model_on(dev)
    opt = make(model.parameters())
    losses = []
    for i in range(steps):
        loss = model(X.to(dev)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if dev != "cpu":
            lazyxla.sync()
        losses.append(float(loss.detach()))
        if between is not None:
            between(i, model, opt)
    return losses, model, opt


def same(got_losses, got_model, want_losses, want_model):
    assert got_losses == pytest.approx(want_losses, rel=1e-4, abs=1e-7)
    for (n, pg), pw in zip(got_model.named_parameters(), want_model.parameters()):
        torch.testing.assert_close(pg.detach().cpu(), pw.detach(), rtol=1e-5, atol=1e-6, msg=n)


def test_alike_parameters_become_rows_of_a_stack_and_train_as_eager_in_one_program():
    want = train("cpu")
    model = model_on(DEV)
    params = list(model.parameters())
    stacked, compiles = cnt("ParamsStacked"), cnt("UncachedCompile")
    got = train(DEV, model=model)
    assert cnt("ParamsStacked") - stacked == 9  # the 4 hidden weights, the 5 biases of width 6
    assert list(got[1].parameters()) == params  # the same Parameter objects
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in params)
    assert cnt("UncachedCompile") - compiles == 1  # one program, the first step's too
    same(*got[:2], *want[:2])


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1),  # L2: the step reads the parameters' stack
    lambda p: torch.optim.AdamW(p, lr=1e-2, amsgrad=True, maximize=True),
], ids=["adam-l2", "amsgrad-maximize"])
def test_other_settings_step_the_stack_as_eager(make):
    before = cnt("ParamsStacked")
    got = train(DEV, make=make)
    assert cnt("ParamsStacked") > before
    same(*got[:2], *train("cpu", make=make)[:2])


def test_what_a_user_does_to_stacked_parameters_is_eagers():
    """A write into one (through a view too), a parameter given another tensor with ``.data =``
    (out of its stack: its group steps its members one by one), a reload of the model's state
    dict mid-training."""
    def poke(i, model, opt):
        with torch.no_grad():
            if i == 0:
                model[3].weight.mul_(0.5)
                model[5].bias[1:].zero_()
            if i == 1:
                model[7].weight.data = torch.full_like(model[7].weight, 0.01)
            if i == 2:
                sd = {k: v.cpu() + 0.001 for k, v in model.state_dict().items()}
                model.load_state_dict(sd)

    want = train("cpu", steps=5, between=poke)
    got = train(DEV, steps=5, between=poke)
    same(*got[:2], *want[:2])


def test_a_state_dict_saved_to_disk_holds_the_trained_values(tmp_path):
    losses, model, _ = train(DEV)
    torch.save(model.state_dict(), tmp_path / "m.pt")
    cpu = model_on("cpu")
    cpu.load_state_dict(torch.load(tmp_path / "m.pt"))
    want_losses, want_model, _ = train("cpu")
    same(losses, cpu, want_losses, want_model)


def test_a_layer_left_out_of_a_step_and_a_frozen_parameter_are_eagers():
    """A step whose group lacks a member (a layer not used, so no gradient: the fused kernel
    steps the others) and a frozen parameter (never stacked) give eager's values."""
    def make_model(dev):
        m = model_on(dev)
        m[-1].bias.requires_grad_(False)
        return m

    def run(dev):
        model = make_model(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for i in range(4):
            h = model[0](X.to(dev))
            for k, layer in enumerate(model[1:-1]):
                if not (i == 2 and k in (2, 3)):  # the second hidden layer left out once
                    h = layer(h)
            model[-1](h).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            if dev != "cpu":
                lazyxla.sync()
        return model

    got, want = run(DEV), run("cpu")
    for pg, pw in zip(got.parameters(), want.parameters()):
        torch.testing.assert_close(pg.detach().cpu(), pw.detach(), rtol=1e-5, atol=1e-6)


def test_replayed_steps_after_lazy_ones_update_the_stack_as_eager():
    want = train("cpu", steps=6)
    model = model_on(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, capturable=True)
    lazy_then_replayed(model, opt, X.to(DEV))
    for pg, pw in zip(model.parameters(), want[1].parameters()):
        torch.testing.assert_close(pg.detach().cpu(), pw.detach(), rtol=1e-5, atol=1e-6)


def test_off_nothing_is_stacked(monkeypatch):
    monkeypatch.setattr(param_stacks, "ENABLED", False)
    before = cnt("ParamsStacked")
    got = train(DEV)
    assert cnt("ParamsStacked") == before
    same(*got[:2], *train("cpu")[:2])


class Block(nn.Module):
    def __init__(self, w=8):
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(w), nn.Linear(w, 2 * w), nn.Linear(2 * w, w)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))


def _entry_counts(depth, monkeypatch):
    """(parameters, outputs) of the entry computation of a rolled model's training program."""
    computation_cache().clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), *(Block() for _ in range(depth)), nn.Linear(8, 1)).to(DEV)
    rolled = cnt("RolledLoops")
    train(DEV, steps=1, model=model)
    assert cnt("RolledLoops") - rolled == 2  # the forward pass and the backward pass
    text = last_program_text()
    entry = text[text.index("\nENTRY"):]
    result = entry[:entry.index("{\n")].split(") -> ", 1)[1]  # the entry's result tuple
    return len(re.findall(r"parameter\(\d+\)", entry)), len(re.findall(r"\w+\[", result))


def test_a_rolled_models_program_does_not_grow_with_depth(monkeypatch):
    """Each layer's parameters are rows of the stacks: the loops read them as slices of the
    stacks and the step writes each stack whole, so the program has as many parameters and
    outputs at depth 12 as at depth 6 (each layer's were parameters and outputs of their own)."""
    p6, o6 = _entry_counts(6, monkeypatch)
    p12, o12 = _entry_counts(12, monkeypatch)
    assert (p12, o12) == (p6, o6)
    monkeypatch.setattr(param_stacks, "ENABLED", False)
    q6, r6 = _entry_counts(6, monkeypatch)
    q12, r12 = _entry_counts(12, monkeypatch)
    assert q12 > q6 and r12 > r6  # (the check can fail: without the stacks both grow)


def test_parameters_are_grouped_by_role_and_nameless_ones_left_alone():
    """A role is a name but for its numbers: each layer's weight one stack, its biases another
    (the input layer's bias, though of that shape, is no hidden layer's role: left apart).
    Parameters made on the device have no recorded name and stay as they are."""
    assert param_stacks.role("bert.encoder.layer.12.attention.self.query.weight") == \
        "bert.encoder.layer.#.attention.self.query.weight"
    assert param_stacks.role("blocks.3.experts.11.w") == "blocks.#.experts.#.w"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 6), nn.Sequential(*(nn.Linear(6, 6) for _ in range(4)))).to(DEV)
    before = cnt("ParamsStacked")
    torch.optim.AdamW(model.parameters())
    assert cnt("ParamsStacked") - before == 8  # 1.#.weight and 1.#.bias, four each
    on_device = nn.Sequential(*(nn.Linear(6, 6, device=DEV) for _ in range(4)))
    before = cnt("ParamsStacked")
    torch.optim.AdamW(on_device.parameters())
    assert cnt("ParamsStacked") == before


@pytest.mark.parametrize("stacked", [True, False])
def test_hf_save_pretrained_writes_every_parameter(tmp_path, monkeypatch, stacked):
    """safetensors and HuggingFace tell tied tensors by their storage's (address, size): every
    parameter, a row of a stack or not, is saved as its own tensor with its trained value (with
    one address for every lazy storage, any two parameters of one size looked tied and
    ``save_pretrained`` refused the model)."""
    transformers = pytest.importorskip("transformers")
    monkeypatch.setattr(param_stacks, "ENABLED", stacked)
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=4, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=16)
    model = transformers.BertForMaskedLM(cfg).to(DEV)
    before = cnt("ParamsStacked")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    assert cnt("ParamsStacked") - before == (16 * 4 if stacked else 0)  # each layer's 16 parameters, 4 layers
    ids = torch.randint(0, 64, (2, 8)).to(DEV)
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    lazyxla.sync()
    model.save_pretrained(tmp_path)
    back = transformers.BertForMaskedLM.from_pretrained(tmp_path)
    want = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    got = back.state_dict()
    for k, v in want.items():
        torch.testing.assert_close(got[k], v, msg=k)


def test_storages_as_pytorch_code_compares_them():
    """Aliases and views share a storage; separate tensors, and the rows of a stack, do not."""
    model = model_on(DEV)
    w = model[1].weight
    torch.optim.AdamW(model.parameters())
    ptr = lambda t: (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())  # noqa: E731
    rows = [model[k].weight for k in (1, 3, 5, 7)]
    assert len({ptr(r) for r in rows}) == 4 and all(ptr(r)[1] == 6 * 6 * 4 for r in rows)
    assert ptr(w.detach()) == ptr(w) and w.detach().data_ptr() == w.data_ptr()
    a = torch.zeros(3, 4).to(DEV)
    b = torch.zeros(3, 4).to(DEV)
    assert ptr(a) != ptr(b) and ptr(a[1]) == ptr(a) and ptr(a.view(-1)) == ptr(a)
    assert a.data_ptr() != 0 and a.data_ptr() != b.data_ptr()


def test_a_torch_compiled_step_updates_stacked_parameters_as_eager():
    def compiled(dev):
        model = model_on(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        return torch_compiled_losses(model, opt, X.to(dev)), model

    torch._dynamo.reset()
    want = compiled("cpu")
    before = cnt("ParamsStacked")
    got = compiled(DEV)
    assert cnt("ParamsStacked") > before
    same(*got, *want)


class Mixed(nn.Module):
    """A layer like Block, but every third one's GELU the tanh approximation: layers that do not
    roll (no run of ``MIN_ITERATIONS`` alike), whose parameters still have their roles."""

    def __init__(self, i, w=8):
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(w), nn.Linear(w, 2 * w), nn.Linear(2 * w, w)
        self.approximate = "tanh" if i % 3 == 2 else "none"

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x)), approximate=self.approximate))


def _unrolled_kernels(stacked, monkeypatch):
    """(distinct kernels, losses) of a model of 12 Mixed layers trained lazily (its backward
    rolls, its forward does not)."""
    monkeypatch.setattr(param_stacks, "ENABLED", stacked)
    computation_cache().clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), *(Mixed(i) for i in range(12)), nn.Linear(8, 1)).to(DEV)
    made = cnt("ParamsStacked")
    losses, *_ = train(DEV, steps=2, model=model)
    assert cnt("ParamsStacked") > made if stacked else cnt("ParamsStacked") == made
    assert any(r.startswith("not rolled") for r in rolling.last_report), rolling.last_report  # the forward
    return distinct_kernels(last_program_text()), losses


def test_rows_read_outside_a_loop_share_their_kernels(monkeypatch):
    """Where the layers do not roll, each layer reads its parameters as rows of the stacks: at
    a row index the program takes as an argument (``lowering.row_args``), so the layers'
    kernels stay one kernel each, as with separate parameters (88 distinct kernels against 97);
    a row at a constant offset was fused into every kernel reading it, a kernel per layer (147
    here; a 20-layer GPT-2 that did not roll: 417 against 149, its compile 70% longer)."""
    from lazyxla.lowering import program
    plain, want = _unrolled_kernels(False, monkeypatch)
    stacked, got = _unrolled_kernels(True, monkeypatch)
    assert got == pytest.approx(want, rel=1e-5)
    assert stacked <= plain + 2, (stacked, plain)
    monkeypatch.setattr(program, "ROW_ARGS_MAX", 0)  # rows at constant offsets
    constant, _ = _unrolled_kernels(True, monkeypatch)
    assert constant > plain + 12, (constant, plain)  # (the check can fail: a kernel per layer)
