"""torch.compile on the lazy device (issue 11): backends ``lazyxla`` and ``lazyxla_eval``.

A compiled region is traced once and then recorded as one IR node per call, so whatever mix of
compiled regions and lazily recorded ops a step has, it runs as one program at sync: the zoo
trains like eager through torch.compile, one execution per step, nothing compiled once warm.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo  # its config module, read before any test of this file runs
import torch.nn as nn
import torch.nn.functional as F

import lazyxla
from lazyhelp import cnt, config_changes, json_runs, torch_config
from test_zoo import MODELS, OPTS, STEPS, batch, loss_of

DEV = lazyxla.device()
CONFIG_AT_IMPORT = torch_config()   # torch's settings before any test of this file ran
pytestmark = pytest.mark.usefixtures("nothing_pending")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_both_backends_resolve_by_name():
    from torch._dynamo.backends.registry import list_backends, lookup_backend
    import lazyxla.regions.torch_compile as be
    assert {"lazyxla", "lazyxla_eval"} <= set(list_backends())
    assert lookup_backend("lazyxla") is be.lazyxla
    assert lookup_backend("lazyxla_eval") is be.lazyxla_eval


def _train(model, kind, opt_name, device, steps=STEPS, compiled=None):
    """``steps`` steps; with ``compiled`` ('model' or 'step') through torch.compile. Returns the
    losses and, per step, (executions, compiles) that the step's sync added."""
    opt = OPTS[opt_name](model.parameters())
    fwd = torch.compile(model, backend="lazyxla") if compiled == "model" else model

    def step(x, y):
        opt.zero_grad()
        loss = loss_of(kind, fwd(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    if compiled == "step":
        step = torch.compile(step, backend="lazyxla")
    model.train()
    losses, counts = [], []
    for i in range(steps):
        x, y = (t.to(device) for t in batch(kind, i))
        loss = step(x, y)
        if device == DEV:
            e, c = cnt("ExecuteComputation"), cnt("UncachedCompile")
            lazyxla.sync()
            counts.append((cnt("ExecuteComputation") - e, cnt("UncachedCompile") - c))
        losses.append(loss)
    return [float(v.item()) for v in losses], counts


def _compare(kind, opt_name, compiled):
    torch.manual_seed(0)
    ref = MODELS[kind]()
    lz = copy.deepcopy(ref).to(DEV)
    want, _ = _train(ref, kind, opt_name, "cpu")
    got, counts = _train(lz, kind, opt_name, DEV, compiled=compiled)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-6)
    for (name, p_ref), p_lz in zip(ref.named_parameters(), lz.parameters()):
        torch.testing.assert_close(p_lz.detach().cpu(), p_ref.detach(), rtol=1e-3, atol=1e-4, msg=name)
    for (name, b_ref), b_lz in zip(ref.named_buffers(), lz.buffers()):
        torch.testing.assert_close(b_lz.cpu(), b_ref, rtol=1e-3, atol=1e-4, msg=name)
    # one step, one program: forward, backward and the update run as one execution
    assert all(e == 1 for e, _ in counts), counts
    # once warm (optimizer state exists after step 1) nothing compiles
    assert all(c == 0 for _, c in counts[2:]), counts


ZOO = [("mlp", "sgd"), ("cnn", "adamw-foreach"), ("resnet", "sgd"), ("lstm", "adam-foreach"),
       ("gru", "sgd"), ("gpt", "adamw-foreach"), ("gpt", "adam-loop")]


@pytest.mark.parametrize("kind,opt", ZOO, ids=[f"{k}-{o}" for k, o in ZOO])
def test_zoo_trains_like_eager_through_torch_compile(kind, opt):
    _compare(kind, opt, "model")


@pytest.mark.parametrize("kind,opt", [("mlp", "sgd"), ("cnn", "adamw-foreach")])
def test_a_whole_compiled_step_trains_like_eager_as_one_program(kind, opt):
    _compare(kind, opt, "step")


def test_a_whole_compiled_step_with_compiled_autograd():
    # torch's own patching restores the setting on exit (see the last test of this file)
    with torch._dynamo.config.patch(compiled_autograd=True):
        _compare("mlp", "sgd", "step")


@torch._dynamo.config.patch(trace_autograd_ops=True)
def test_a_whole_compiled_step_with_backward_traced_into_the_graph():
    # Dynamo traces backward() into the step's graph: forward and backward are one region; the
    # optimizer step breaks the graph on purpose, and SGD's fused step (lazyxla's default) is one
    # node recorded outside any region
    torch.manual_seed(0)
    ref = MODELS["mlp"]()
    lz = copy.deepcopy(ref).to(DEV)
    steps = []
    for model, device in ((ref, "cpu"), (lz, DEV)):
        opt = OPTS["sgd"](model.parameters())

        def step(x, y, model=model, opt=opt):
            opt.zero_grad()
            loss_of("mlp", model(x), y).backward()
            opt.step()

        steps.append((torch.compile(step, backend="lazyxla") if device == DEV else step, device))
    per_step = []
    for i in range(4):
        for step, device in steps:
            c = cnt("DynamoRegionCall")
            step(*(t.to(device) for t in batch("mlp", i)))
            if device == DEV:
                lazyxla.sync()
                per_step.append(cnt("DynamoRegionCall") - c)
    assert per_step[1:] == [1, 1, 1], per_step
    for (name, p_ref), p_lz in zip(ref.named_parameters(), lz.parameters()):
        torch.testing.assert_close(p_lz.detach().cpu(), p_ref.detach(), rtol=1e-4, atol=1e-6, msg=name)


def test_a_region_is_traced_once_and_found_by_its_hash_every_call():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 2)).to(DEV)
    f = torch.compile(m, backend="lazyxla_eval")
    x = torch.randn(3, 6)
    with torch.no_grad():
        want = m(x.to(DEV)).cpu()
        captured = cnt("DynamoExtractCompiledGraph")
        outs = []
        for _ in range(4):
            outs.append(f(x.to(DEV)))
            h = lazyxla.graph_hash(outs[-1])
            c = cnt("CachedCompile")
            lazyxla.sync()
            if len(outs) > 1:
                assert h == first and cnt("CachedCompile") == c + 1  # the same program, by hash
            else:
                first = h
    assert cnt("DynamoExtractCompiledGraph") == captured + 1  # traced once, not per call
    for o in outs:
        torch.testing.assert_close(o.cpu(), want)


def test_an_evicted_program_is_compiled_again_and_counted():
    from lazyxla.compiler import cache
    lru = cache.computation_cache()
    old = lru.capacity
    m = nn.Linear(4, 4).to(DEV)
    f = torch.compile(m, backend="lazyxla_eval")
    x = torch.randn(2, 4)
    try:
        lru.capacity = 1
        with torch.no_grad():
            want = m(x.to(DEV)).cpu()
            for _ in range(2):
                y = f(x.to(DEV))
                u = cnt("UncachedCompile")
                lazyxla.sync()
                assert cnt("UncachedCompile") == u + 1  # its program was evicted by the other one
                torch.testing.assert_close(y.cpu(), want)
                keep = torch.ones(3, device=DEV) * 5  # another program takes the one slot (a sync's: a read
                lazyxla.sync()                         # of scalars alone may be answered on the host)
                del keep
    finally:
        lru.capacity = old


def test_dropout_draws_new_numbers_every_call():
    f = torch.compile(nn.Dropout(0.5), backend="lazyxla")
    x = torch.ones(64, device=DEV)
    masks = []
    for _ in range(3):
        y = f(x)
        lazyxla.sync()
        masks.append(y.cpu())
    assert all(set(m.unique().tolist()) <= {0.0, 2.0} for m in masks)
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
    lazyxla.manual_seed(3)
    a = f(x).cpu()
    lazyxla.manual_seed(3)
    assert torch.equal(f(x).cpu(), a)  # the seed decides, as on the lazy path


def test_in_place_updates_of_inputs_land_in_the_callers_tensors():
    def bump(x, acc):
        acc.add_(x)
        return x * 2

    f = torch.compile(bump, backend="lazyxla_eval")
    x, acc = torch.arange(3.0), torch.zeros(3)
    lx, lacc = x.to(DEV), acc.to(DEV)
    view = lacc[1:]
    for _ in range(3):
        out = f(lx, lacc)
        lazyxla.sync()
    assert torch.equal(lacc.cpu(), 3 * x) and torch.equal(view.cpu(), (3 * x)[1:])
    assert torch.equal(out.cpu(), 2 * x)


def test_an_op_without_a_lowering_in_a_region_gives_eagers_numbers():
    @torch.library.custom_op("lazyxla_test::halve", mutates_args=())
    def halve(x: torch.Tensor) -> torch.Tensor:
        return x / 2

    halve.register_fake(lambda x: torch.empty_like(x))

    def f(x):
        return halve(x.sin()) + 1

    g = torch.compile(f, backend="lazyxla_eval")
    x = torch.randn(5)
    before = cnt("aten::halve")
    for _ in range(2):
        torch.testing.assert_close(g(x.to(DEV)).cpu(), f(x))
    assert cnt("aten::halve") == before + 2  # on the CPU each call, counted as torch_xla does


def test_a_cpu_input_to_a_compiled_function_names_both_devices():
    m = nn.Linear(3, 3).to(DEV)
    f = torch.compile(m, backend="lazyxla")
    with pytest.raises(Exception, match=r"(?s)cpu.*lazyxla|lazyxla.*cpu"):
        f(torch.randn(2, 3))
    g = torch.compile(nn.Linear(3, 3), backend="lazyxla_eval")
    with pytest.raises(Exception, match=r"graph input \d+ is on cpu, not on lazyxla:0"):
        g(torch.randn(2, 3))


def test_a_compiled_forward_and_lazily_recorded_ops_share_one_program():
    m = nn.Linear(4, 4).to(DEV)
    f = torch.compile(m, backend="lazyxla_eval")
    x = torch.randn(2, 4)
    with torch.no_grad():
        want = (m(x.to(DEV)) * 3).relu().cpu()
        for _ in range(2):
            y = (f(x.to(DEV) + 0) * 3).relu()
            e = cnt("ExecuteComputation")
            lazyxla.sync()
            assert cnt("ExecuteComputation") == e + 1
            torch.testing.assert_close(y.cpu(), want)


def test_a_dynamo_recompile_is_explained_in_the_recompile_log():
    m = nn.Linear(4, 2).to(DEV)
    f = torch.compile(m, backend="lazyxla")
    start = len(lazyxla.debug.recompile_log())
    for bs in (8, 16):
        out = f(torch.randn(bs, 4, device=DEV))
        out.sum().backward()
        lazyxla.sync()
    recs = [r for r in lazyxla.debug.recompile_log()[start:] if r.site == "dynamo"]
    assert recs, lazyxla.debug.recompile_log()[start:]
    assert "size mismatch at index 0. expected 8, actual 16" in recs[0].text
    assert "a guard failed" in str(recs[0]) and recs[0].where is not None


def test_pt_xla_debug_level_reports_compiled_regions(tmp_path):
    import os
    import subprocess
    import sys
    script = ("import torch, torch.nn as nn, lazyxla\n"
              "m = nn.Linear(4, 2).to(lazyxla.device())\n"
              "f = torch.compile(m, backend='lazyxla_eval')\n"
              "with torch.no_grad():\n"
              "    for bs in (8, 16):\n"
              "        y = f(torch.randn(bs, 4, device=lazyxla.device()))\n"
              "        lazyxla.sync()\n")
    env = dict(os.environ, PT_XLA_DEBUG_LEVEL="1", PT_XLA_DEBUG_FILE=str(tmp_path / "debug.txt"))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    text = (tmp_path / "debug.txt").read_text()
    assert text.count("torch.compile region traced Cause") == 2, text
    assert "first trace" in text and "a guard failed" in text and "size mismatch at index 0" in text
    assert text.count("Compilation Cause") == 2  # the program of each batch size, compiled at its sync


class _StaticCacheLM(nn.Module):
    """A 2-layer decoder with a static KV cache (buffers written at ``pos``, a device tensor, as
    HuggingFace's StaticCache does): every decode step has the same shapes."""

    def __init__(self, vocab=19, dim=16, heads=2, layers=2, tmax=16):
        super().__init__()
        self.emb, self.pos_emb = nn.Embedding(vocab, dim), nn.Embedding(tmax, dim)
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
                                 for _ in range(layers))
        self.head = nn.Linear(dim, vocab)
        self.h, self.tmax = heads, tmax
        for i in range(layers):
            self.register_buffer(f"k{i}", torch.zeros(1, heads, tmax, dim // heads))
            self.register_buffer(f"v{i}", torch.zeros(1, heads, tmax, dim // heads))

    def forward(self, tok, pos):  # tok: (1, 1) token, pos: (1,) its position
        x = self.emb(tok) + self.pos_emb(pos)[None]
        visible = (torch.arange(self.tmax, device=tok.device) <= pos)[None, None, None, :]
        for i, (qkv, mlp) in enumerate(zip(self.qkv, self.mlp)):
            q, k, v = (t.reshape(1, 1, self.h, -1).transpose(1, 2) for t in qkv(x).chunk(3, -1))
            kc, vc = getattr(self, f"k{i}"), getattr(self, f"v{i}")
            kc.index_copy_(2, pos, k)
            vc.index_copy_(2, pos, v)
            a = F.scaled_dot_product_attention(q, kc, vc, attn_mask=visible)
            x = x + a.transpose(1, 2).reshape(1, 1, -1)
            x = x + mlp(x)
        return self.head(x)[:, -1]


def _greedy(model, device, n, step=None, compiles=None):
    step = step if step is not None else model
    tok = torch.tensor([[3]], device=device)
    out = []
    with torch.no_grad():
        for p in range(n):
            logits = step(tok, torch.tensor([p], device=device))
            tok = logits.argmax(-1, keepdim=True)
            if device == DEV:
                lazyxla.sync()
                compiles.append(cnt("UncachedCompile"))
            out.append(int(tok.item()))
    return out


def test_static_kv_cache_decoding_compiles_a_fixed_number_of_programs():
    torch.manual_seed(0)
    ref = _StaticCacheLM().eval()
    lz = copy.deepcopy(ref).to(DEV)
    want = _greedy(ref, "cpu", 12)
    compiles = []
    got = _greedy(lz, DEV, 12, torch.compile(lz, backend="lazyxla_eval"), compiles)
    assert got == want
    assert compiles[-1] == compiles[2], compiles  # no new program per token once warm
    torch.testing.assert_close(lz.k1.cpu(), ref.k1)  # the cache writes landed in the buffers


def test_a_compiled_step_is_found_in_the_persistent_cache_by_another_process(tmp_path):
    script = ("import json, torch, torch.nn as nn, lazyxla\n"
              "import lazyxla.debug.metrics as met\n"
              "torch.manual_seed(0)\n"
              "m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(lazyxla.device())\n"
              "f = torch.compile(m, backend='lazyxla')\n"
              "x = torch.ones(3, 4, device=lazyxla.device())\n"
              "loss = f(x).sum()\n"
              "loss.backward()\n"
              "h = lazyxla.graph_hash([loss, m[0].weight.grad])\n"
              "lazyxla.sync()\n"
              "print(json.dumps([h, loss.item(), met.counter_value('PersistentCacheHit') or 0,"
              " met.counter_value('PersistentCacheMiss') or 0]))\n")
    runs = json_runs(script, times=2, XLA_PERSISTENT_CACHE_PATH=str(tmp_path / "cache"))
    (h1, l1, hit1, miss1), (h2, l2, hit2, miss2) = runs
    assert h1 == h2 and l1 == l2  # the same key in both processes
    assert miss1 >= 1 and hit2 >= 1 and miss2 == 0


def test_views_of_inputs_behave_as_in_eager():
    def f(x, y):
        y.mul_(2)           # y is a view of a bigger tensor: the write reaches its base
        return x[1:], x.t()  # views of an input: writing them writes x

    g = torch.compile(f, backend="lazyxla_eval")
    for _ in range(2):
        base, x = torch.zeros(6), torch.arange(6.0).reshape(2, 3)
        lbase, lx = base.to(DEV) + 1, x.to(DEV)
        a, b = g(lx, lbase[::2])
        a.add_(10)
        b[0, 0] = -1
        lazyxla.sync()
        want_x = x.clone()
        want_x[1:] += 10
        want_x[0, 0] = -1
        assert torch.equal(lx.cpu(), want_x)
        assert torch.equal(lbase.cpu(), torch.tensor([2.0, 1, 2, 1, 2, 1]))
    m = nn.Linear(3, 3).to(DEV)
    h = torch.compile(lambda x: m(x)[0], backend="lazyxla")  # AOTAutograd regenerates such views itself
    x = torch.randn(2, 3)
    torch.testing.assert_close(h(x.to(DEV)).cpu(), m(x.to(DEV))[0].cpu())


def test_a_graph_break_runs_the_break_lazily_with_eagers_numbers():
    def f(x):
        y = x.sin() * 2
        print("between the two graphs")  # Dynamo breaks the graph here and runs print eagerly
        return y.cos() + 1

    g = torch.compile(f, backend="lazyxla_eval")
    x = torch.randn(4)
    for _ in range(2):
        torch.testing.assert_close(g(x.to(DEV)).cpu(), f(x))


def test_buffer_donation_works_through_torch_compile():
    import lazyxla.debug.metrics as met
    m = nn.Linear(8, 8).to(DEV)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    f = torch.compile(m, backend="lazyxla")
    for _ in range(3):
        opt.zero_grad()
        f(torch.ones(2, 8, device=DEV)).sum().backward()
        opt.step()
        lazyxla.sync()
    aliased = met.metric_data("InputOutputAliasCount")[2][-1][1]
    assert aliased >= 4  # weight, bias and their momentum buffers updated in place
    assert torch.isfinite(m.weight.cpu()).all()  # the donated buffers' tensors still read


def test_torch_config_is_as_the_patching_tests_found_it():
    # runs after the tests above that patch compiled_autograd and trace_autograd_ops: both
    # settings still exist with the values they had before this file's tests, and a later
    # torch.compile works (a deleted setting failed every later compile of the process)
    cfg = torch._dynamo.config
    for name in ("compiled_autograd", "trace_autograd_ops"):
        assert getattr(cfg, name) == CONFIG_AT_IMPORT[f"torch._dynamo.config.{name}"], name
    assert not config_changes(CONFIG_AT_IMPORT, torch_config())
    f = torch.compile(lambda a: a * 2 + 1, backend="lazyxla")
    assert f(torch.ones(3, device=DEV)).cpu().tolist() == [3.0, 3.0, 3.0]
