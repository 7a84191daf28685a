"""Repeated layers rolled into loops (``lazyxla.rolling``): an unchanged model whose layers are a
Python loop over alike modules trains to eager's values with its forward and backward passes
each compiled as one loop; random ops get each iteration's own numbers; value checks inside
a rolled body still name the op and the line; layers that differ are left unrolled."""
import jax
import pytest
import torch

import lazyxla
import lazyxla.debug.metrics as met
from lazyxla import rolling
from lazyxla.rolling import settings as roll_settings
from lazyxla.compiler.cache import computation_cache

pytestmark = pytest.mark.usefixtures("nothing_pending")


@pytest.fixture
def roll_small(monkeypatch):
    monkeypatch.setattr(roll_settings, "MIN_ITERATIONS", 4)
    monkeypatch.setattr(roll_settings, "WORK", "0")  # tiny layers: rolled though their loops cost more than they save
    monkeypatch.setattr(roll_settings, "ENABLED", True)
    computation_cache().clear()
    yield
    computation_cache().clear()


class Block(torch.nn.Module):
    def __init__(self, w, p=0.0):
        super().__init__()
        self.ln = torch.nn.LayerNorm(w)
        self.fc1 = torch.nn.Linear(w, 4 * w)
        self.fc2 = torch.nn.Linear(4 * w, w)
        self.drop = torch.nn.Dropout(p)

    def forward(self, x):
        return x + self.drop(self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x)))))


class Net(torch.nn.Module):
    def __init__(self, depth, w=16, p=0.0, widths=None):
        super().__init__()
        self.inp = torch.nn.Linear(8, w)
        self.blocks = torch.nn.ModuleList(Block(w, p) for _ in range(depth))
        self.out = torch.nn.Linear(w, 1)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h).pow(2).mean()


def _train(model, x, steps, dev=None):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = model(x if dev is None else x.to(dev))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if dev is not None:
            lazyxla.sync()
        losses.append(loss.item())
    return losses


def test_loop_of_alike_layers_rolls_and_trains_as_eager(roll_small):
    torch.manual_seed(0)
    ref = Net(6)
    lazy = Net(6)
    lazy.load_state_dict(ref.state_dict())
    x = torch.randn(4, 8)
    met.clear_counters()
    dev = lazyxla.device()
    lazy.to(dev)
    xla_compiles = []  # every XLA program compiled while the lazy model trains, lazyxla's or not
    on = [True]
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, secs, **kw: on[0] and name == "/jax/core/compile/backend_compile_duration"
        and xla_compiles.append(secs))
    try:
        got = _train(lazy, x, 3, dev)
    finally:
        on[0] = False
    want = _train(ref, x, 3)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    for a, b in zip(ref.parameters(), lazy.parameters()):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-3, atol=5e-5)
    # the forward pass and the backward pass, six layers each: a loop each, at least five layers in it
    assert met.counter_value("RolledLoops") == 2
    assert met.counter_value("RolledIterations") >= 10
    assert met.counter_value("UncachedCompile") == 1
    assert len(xla_compiles) == 1  # the program's workspace starts without a program of its own
    assert sum(r.startswith("rolled at") for r in rolling.last_report) == 2


def test_on_a_tpu_the_stacks_start_uninitialized_in_the_program_and_it_takes_no_workspace(roll_small, monkeypatch):
    """``lowering.rolled.STACK_BUFFERS``: a TPU's (and a GPU's) loops write their stacked outputs
    into ``jax.lax.empty`` buffers (XLA's AllocateBuffer there; zeros on this CPU), so the program
    holds nothing between steps; here the TPU's rule, lowered for the CPU, trains as eager."""
    from lazyxla.compiler.compile import WorkspaceCall
    from lazyxla.lowering import program
    monkeypatch.setattr(program, "platform", lambda: "tpu")
    torch.manual_seed(0)
    ref, lazy = Net(6), Net(6)
    lazy.load_state_dict(ref.state_dict())
    x = torch.randn(4, 8)
    met.clear_counters()
    lazy.to(lazyxla.device())
    got = _train(lazy, x, 3, lazyxla.device())
    assert got == pytest.approx(_train(ref, x, 3), rel=1e-5, abs=1e-6)
    assert met.counter_value("RolledLoops") == 2 and met.counter_value("UncachedCompile") == 1
    programs = [p.executable for p in computation_cache().values()]
    assert len(programs) == 1
    assert type(programs[0]) is not WorkspaceCall or not programs[0].specs  # no workspace argument
    monkeypatch.setattr(program, "platform", lambda: "cpu")
    computation_cache().clear()
    _train(lazy, x, 1, lazyxla.device())  # the CPU's rule: the same program with a workspace
    programs = [p.executable for p in computation_cache().values()]
    assert type(programs[0]) is WorkspaceCall and len(programs[0].specs) > 0


def test_a_rolled_programs_text_compiles_nothing_and_counts_nothing(roll_small):
    torch.manual_seed(0)
    dev = lazyxla.device()
    model = Net(6).to(dev)
    loss = model(torch.randn(4, 8).to(dev))
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    met.clear_all()
    text = lazyxla.dump_hlo([loss] + grads)
    assert "while" in text  # the rolled loops are in the text
    assert met.counter_names() == [] and met.metric_names() == []
    lazyxla.sync()
    assert met.counter_value("RolledLoops") == 2 and met.counter_value("UncachedCompile") == 1


def test_each_compile_says_what_rolled_and_what_did_not(roll_small):
    import lazyxla.debug
    torch.manual_seed(0)
    dev = lazyxla.device()
    model = Net(6).to(dev)
    model(torch.randn(4, 8).to(dev)).backward()
    lazyxla.sync()
    text = lazyxla.debug.recompile_log()[-1].text
    assert "[layers] rolled at test_rolling.py:" in text and "iterations of" in text, text

    class Small(torch.nn.Module):  # alike layers of two ops: too small a body to roll
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(8))

        def forward(self, x):
            for m in self.layers:
                x = torch.tanh(m(x))
            return x.sum()

    small = Small().to(dev)
    with torch.no_grad():
        out = small(torch.randn(4, 8).to(dev))
        lazyxla.sync()
    assert out.cpu().isfinite()
    text = lazyxla.debug.recompile_log()[-1].text
    assert "not rolled at test_rolling.py:" in text and "fewer than" in text, text


def _dropout_losses(roll, monkeypatch):
    monkeypatch.setattr(roll_settings, "ENABLED", roll)
    computation_cache().clear()
    torch.manual_seed(0)
    model = Net(5, p=0.3)
    lazyxla.manual_seed(7)
    dev = lazyxla.device()
    model.to(dev)
    met.clear_counters()
    losses = _train(model, torch.randn(4, 8), 3, dev)
    return losses, met.counter_value("RolledLoops"), [p.cpu() for p in model.parameters()]


def test_random_ops_in_a_rolled_body_draw_as_the_unrolled_program(roll_small, monkeypatch):
    rolled, loops, p_rolled = _dropout_losses(True, monkeypatch)
    unrolled, none, p_unrolled = _dropout_losses(False, monkeypatch)
    assert loops == 2 and none is None
    assert rolled == pytest.approx(unrolled, rel=1e-6)
    for a, b in zip(p_rolled, p_unrolled):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


class Lookup(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 16)
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, h, ids):
        shift = (h[:, 0] > 1e9).long()  # 0, but from the carry: the lookup is inside the loop's body
        return h + torch.tanh(self.fc(h)) * self.emb(ids + shift)


def test_a_value_check_inside_a_rolled_body_names_the_op_and_the_line(roll_small):
    dev = lazyxla.device()
    layers = torch.nn.ModuleList(Lookup() for _ in range(8)).to(dev)
    h = torch.randn(3, 16).to(dev)
    ids = torch.tensor([1, 2, 12]).to(dev)  # 12 is outside the tables' 10 rows
    with pytest.raises(Exception) as e:
        for layer in layers:
            h = layer(h, ids)
        h.sum().item()
    text = str(e.value)
    assert "embedding" in text or "index" in text
    assert "test_rolling.py" in text
    assert met.counter_value("RolledLoops")


def test_layers_that_differ_are_left_unrolled(roll_small):
    dev = lazyxla.device()
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(torch.nn.Linear(8 + i, 9 + i) for i in range(8)).to(dev)
    met.clear_counters()
    h = torch.randn(2, 8).to(dev)
    for layer in layers:
        h = torch.tanh(layer(h))
    h.sum().backward()
    lazyxla.sync()
    assert met.counter_value("RolledLoops") is None


def test_a_shallow_model_is_not_rolled_when_asked(monkeypatch):
    # rolling pays from about 20 layers on (bench/compile_depth.py): below, XLA compiles the
    # unrolled program faster than the loop's plumbing
    monkeypatch.setattr(roll_settings, "ENABLED", True)
    computation_cache().clear()
    torch.manual_seed(0)
    dev = lazyxla.device()
    model = Net(6).to(dev)
    met.clear_counters()
    _train(model, torch.randn(4, 8), 1, dev)
    assert met.counter_value("RolledLoops") is None


def test_layers_roll_only_where_an_iteration_does_more_work_than_its_loop_costs(monkeypatch):
    """On XLA:CPU a loop's iteration costs ~13 us besides its body (``rolling.work``): layers
    whose iterations do less than the platform's floor (``LAZYXLA_ROLL_MIN_WORK``) stay
    unrolled and the compile says why; wider layers, or any with the floor at 0, roll."""
    from lazyxla.rolling import find
    monkeypatch.setattr(roll_settings, "MIN_ITERATIONS", 4)
    monkeypatch.setattr(roll_settings, "ENABLED", True)
    monkeypatch.setattr(find, "platform", lambda: "cpu")  # the CPU's floor on any device
    dev = lazyxla.device()

    def loops(width, rows):
        computation_cache().clear()
        torch.manual_seed(0)
        model = Net(5, w=width).to(dev)
        met.clear_counters()
        _train(model, torch.randn(rows, 8), 1, dev)
        return met.counter_value("RolledLoops") or 0, list(rolling.last_report)

    n, report = loops(16, 4)  # ~16k operations an iteration
    assert n == 0
    assert any("operations each, fewer than the 4,000,000 a loop's iteration must do to pay for itself on cpu "
               "(LAZYXLA_ROLL_MIN_WORK)" in r for r in report), report
    assert loops(64, 128)[0] == 2  # ~8.5M forward: the forward and backward passes roll
    monkeypatch.setattr(roll_settings, "WORK", "0")
    assert loops(16, 4)[0] == 2
    monkeypatch.setattr(roll_settings, "WORK", "lots")
    with pytest.raises(ValueError, match="LAZYXLA_ROLL_MIN_WORK='lots': a number of operations"):
        roll_settings.min_work("cpu")


def test_an_iterations_work_counts_a_product_as_2mnk_and_other_ops_once_per_element():
    from lazyxla.ir.node import post_order
    from lazyxla.rolling.work import flops
    dev = lazyxla.device()
    a, b = torch.randn(16, 64).to(dev), torch.randn(64, 32).to(dev)
    c = torch.relu(a @ b)
    nodes = [n for n in post_order([c._state.storage.ir]) if n.data is None]
    assert sorted(n.sig.op for n in nodes) == ["aten::mm", "aten::relu"]
    assert flops(nodes) == 2 * 16 * 64 * 32 + 16 * 32
    lazyxla.sync()


def _train_hf(build, roll, monkeypatch, steps):
    """Losses of ``steps`` AdamW steps of the HF model ``build()`` makes, rolled or not, the
    iterations rolled and the last compile's rolling report."""
    monkeypatch.setattr(roll_settings, "ENABLED", roll)
    computation_cache().clear()
    torch.manual_seed(0)
    dev = lazyxla.device()
    model = build().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (2, 16)).to(dev)
    lazyxla.manual_seed(3)
    met.clear_counters()
    losses = []
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        lazyxla.sync()
        losses.append(loss.item())
    return losses, met.counter_value("RolledIterations"), list(rolling.last_report)


@pytest.mark.parametrize("pdrop", [0.1, 0.0])
def test_hf_gpt2_rolls_every_layer_and_trains_as_unrolled(roll_small, monkeypatch, pdrop):
    transformers = pytest.importorskip("transformers")

    def build():
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=64, n_positions=16, n_embd=32, n_layer=5, n_head=2,
            resid_pdrop=pdrop, embd_pdrop=pdrop, attn_pdrop=pdrop))

    rolled, n, report = _train_hf(build, True, monkeypatch, 3)
    unrolled, none, _ = _train_hf(build, False, monkeypatch, 3)
    assert rolled == pytest.approx(unrolled, rel=1e-5)
    # every layer in a loop, forward and backward: each loop cut at a layer's boundary (without
    # dropout, the first cut found is in a layer, with one value crossing as at the boundary;
    # the boundary holds one more iteration)
    assert n == 10, report
    assert none is None


def test_a_model_of_just_the_least_depth_rolls_every_layer(roll_small, monkeypatch):
    """As many layers as ``MIN_ITERATIONS``: the first and last layers' copies hash apart from
    the others (what uses them differs near the ends), so the class of carries holds fewer; the
    loop found from it holds them all (a 20-layer GPT-2 was left unrolled at the default 20)."""
    transformers = pytest.importorskip("transformers")

    def build():
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=64, n_positions=16, n_embd=16, n_layer=roll_settings.MIN_ITERATIONS, n_head=2,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))

    rolled, n, report = _train_hf(build, True, monkeypatch, 2)
    unrolled, _, _ = _train_hf(build, False, monkeypatch, 2)
    assert n == 2 * roll_settings.MIN_ITERATIONS, report  # every layer, forward and backward
    assert rolled == pytest.approx(unrolled, rel=1e-5)


@pytest.mark.parametrize("opt", ["SGD(model.parameters(), lr=0.1)", "AdamW(model.parameters(), lr=0.01)"],
                         ids=["sgd", "adamw-stacked-params"])
def test_a_rolled_program_is_kept_by_the_persistent_cache(tmp_path, opt):
    from lazyhelp import json_runs
    script = ("import json, time, torch, lazyxla\n"
              "import lazyxla.debug.metrics as met\n"
              "from lazyxla import rolling\n"
              "roll = rolling.roll\n"
              "rolling.roll = lambda *a, **k: (time.sleep(0.3), roll(*a, **k))[1]  # a roll that takes its time\n"
              "torch.manual_seed(0)\n"
              "blocks = [torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.Linear(16, 16), torch.nn.GELU())"
              " for _ in range(6)]\n"
              "model = torch.nn.Sequential(*blocks)\n"
              "ref = [p.detach().clone() for p in model.parameters()]\n"
              "dev = lazyxla.device()\n"
              "model.to(dev)\n"
              f"opt = torch.optim.{opt}\n"
              "x = torch.randn(4, 16)\n"
              "losses = []\n"
              "for _ in range(3):\n"
              "    loss = model(x.to(dev)).pow(2).mean()\n"
              "    loss.backward(); opt.step(); opt.zero_grad(); lazyxla.sync()\n"
              "    losses.append(loss.item())\n"
              "t = {k: (met.metric_data(k) or (0, 0))[1] for k in ('CompileTime', 'CompileRollTime',"
              " 'CompileTraceTime', 'CompileLowerTime', 'CompileBackendTime')}\n"
              "print(json.dumps([losses, met.counter_value('RolledLoops') or 0,"
              " met.counter_value('PersistentCacheHit') or 0, met.counter_value('ParamsStacked') or 0, t]))\n")
    env = dict(XLA_PERSISTENT_CACHE_PATH=str(tmp_path / "cache"), LAZYXLA_ROLL_LAYERS="1", LAZYXLA_ROLL_MIN="4",
               LAZYXLA_ROLL_MIN_WORK="0", LAZYXLA_CACHE_HMAC_KEY_FILE=str(tmp_path / "key"))
    (l1, rolled1, hit1, stacked1, t1), (l2, rolled2, hit2, _, _) = json_runs(script, times=2, **env)
    # rows of stacks: AdamW's every role of alike layers (rolled); SGD's roles of 8 or more
    # (param_stacks.SGD_MIN_ROWS): the 12 biases of the norms and the linears
    assert stacked1 == (24 if opt.startswith("AdamW") else 12), stacked1
    assert rolled1 >= 1 and hit1 == 0  # counted once per compile, though the cache was asked first
    # and the compile's time holds its parts, the roll the cache lookup asked for among them
    assert t1["CompileTime"] >= sum(v for k, v in t1.items() if k != "CompileTime") > 3e8, t1
    assert hit2 >= 1  # the second process runs the stored rolled program (its workspace given back)
    assert l1 == l2  # (a rolled model's losses are the unrolled one's: the tests above)


def test_rows_of_loop_stacks_are_stacked_in_any_order_as_eager_stacks_them():
    """The optimizer's group of alike parameters stacks their gradients in the model's order:
    rows of a loop's stacks, several stacks in turn (each layer's q, k, v, o), forward or
    reversed, every d-th row, with other values between: taken as slices of the stacks, equal to
    a stack."""
    import jax.numpy as jnp
    import numpy as np
    from lazyxla.lowering import program

    a = jnp.arange(15, dtype=jnp.float32).reshape(5, 3)
    b, c, other = a + 100, a + 1000, jnp.full((3,), -1.0)
    was, program._trace = program._trace, program._Trace([])
    try:
        def row(st, k):
            v = st[k]
            program.note_row(v, st, k)
            return v
        cases = [[row(a, k) for k in range(5)],
                 [row(a, k) for k in range(4, -1, -1)],
                 [x for k in range(5) for x in (row(a, k), row(b, k), row(c, k))],
                 [other] + [x for k in range(4, 0, -1) for x in (row(a, k), row(b, k))] + [other, row(c, 2)],
                 [row(a, 0), row(b, 3), row(a, 1)],
                 # every d-th row of one stack (a layer's parameter among a stack of parameters)
                 [row(a, k) for k in (0, 2, 4)], [row(a, k) for k in (3, 1)], [other, row(a, 1), row(a, 4), other],
                 [x for k in (0, 2, 4) for x in (row(a, k), row(b, 4 - k))]]
        for values in cases:
            np.testing.assert_array_equal(np.asarray(program.stack_rows(values)), np.asarray(jnp.stack(values)))
    finally:
        program._trace = was


def _hf(name, depth):
    transformers = pytest.importorskip("transformers")
    if name == "llama":  # a pre-norm layer: two norms alike to some depth, half a layer apart
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=depth, num_attention_heads=2, num_key_value_heads=2,
            intermediate_size=64, max_position_embeddings=16))
    # a post-norm layer, and dropout. 128 wide: XLA:CPU compiled the 32-wide model's steps in twice
    # the time (its fusion pass copies each layer norm's backward into every small reduction fed by
    # it: a 4-layer BERT's step compiled in 12 s at 32 wide, 6.9 at 64, 3.0 at 128)
    return transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=64, hidden_size=128, num_hidden_layers=depth, num_attention_heads=2, intermediate_size=256,
        max_position_embeddings=16))


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_hf_llama_and_bert_roll_every_layer_at_its_boundary(roll_small, monkeypatch, name):
    rolled, n, report = _train_hf(lambda: _hf(name, 5), True, monkeypatch, 2)
    unrolled, _, _ = _train_hf(lambda: _hf(name, 5), False, monkeypatch, 2)
    assert rolled == pytest.approx(unrolled, rel=1e-5)
    assert n == 10, report  # forward and backward: all 5 layers each, none left unrolled at an end
    assert all(" 1 carries" in line for line in report if line.startswith("rolled")), report
