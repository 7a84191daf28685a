"""Capture once, replay many (issue 22): ``lazyxla.Graph`` / ``lazyxla.graph`` with CUDA Graphs'
contract, ``lazyxla.compile(fn, replay=True)``, ``make_graphed_callables``; what a replay binds,
what it freezes and what it refuses.

Every numeric check is against PyTorch eager on the CPU (or against lazyxla's own lazy path
where randomness is drawn); counts are deltas of the metrics a user reads.
"""
from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazyxla
import lazyxla.debug.metrics as met
from lazyhelp import cnt, json_runs, samples

DEV = lazyxla.device()
pytestmark = pytest.mark.usefixtures("nothing_pending")
_widths = itertools.count(41)  # each test's model has widths no other test compiled


def batches(n, width, classes=4, batch=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, width, generator=g), torch.randint(0, classes, (batch,), generator=g))
            for _ in range(n)]


def mlp(width, classes=4, dropout=0.0):
    torch.manual_seed(0)
    layers = [nn.Linear(width, 16), nn.ReLU()] + ([nn.Dropout(dropout)] if dropout else []) + [nn.Linear(16, classes)]
    return nn.Sequential(*layers)


def train_step(model, opt, x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def sgd(m):
    return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


class Delta:
    def __init__(self, *names):
        self.names = names
        self.base = {k: cnt(k) for k in names}

    def __getitem__(self, k):
        return cnt(k) - self.base[k]


def close(a, b, tol=1e-5):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def _warm_and_capture(width, data, make_opt=sgd, dropout=0.0):
    """The CUDA Graphs recipe: one warm-up step (momentum appears), grads set to None, capture."""
    ref = mlp(width, dropout=dropout)
    lz = copy.deepcopy(ref).to(DEV)
    ropt, opt = make_opt(ref), make_opt(lz)
    x0, y0 = data[0]
    ropt.zero_grad(set_to_none=True)
    train_step(ref, ropt, x0, y0)
    opt.zero_grad(set_to_none=True)
    train_step(lz, opt, x0.to(DEV), y0.to(DEV))
    lazyxla.sync()
    static_x, static_y = data[1][0].to(DEV), data[1][1].to(DEV)
    opt.zero_grad(set_to_none=True)
    g = lazyxla.Graph()
    with lazyxla.graph(g):
        static_loss = train_step(lz, opt, static_x, static_y)
    return ref, ropt, lz, opt, g, static_x, static_y, static_loss


# ---------------------------------------------------------------------------------------------
# 1. lazyxla.Graph / lazyxla.graph
def test_a_captured_whole_step_replays_like_eager_updating_everything_in_place():
    w = next(_widths)
    data = batches(7, w)
    ref, ropt, lz, opt, g, sx, sy, sloss = _warm_and_capture(w, data)
    d = Delta("UncachedCompile", "CachedCompile", "ExecuteComputation", "GraphReplay", "MarkStep")
    for i in range(1, 7):
        x, y = data[i]
        sx.copy_(x.to(DEV))
        sy.copy_(y.to(DEV))
        g.replay()
        ropt.zero_grad(set_to_none=True)
        want = train_step(ref, ropt, x, y)
        close(sloss.detach().cpu(), want.detach())  # the static loss is refreshed in place
        for p_ref, p in zip(ref.parameters(), lz.parameters()):
            close(p.grad.cpu(), p_ref.grad)  # each replay refills .grad
    for p_ref, p in zip(ref.parameters(), lz.parameters()):
        close(p.detach().cpu(), p_ref.detach())
        close(opt.state[p]["momentum_buffer"].cpu(), ropt.state[p_ref]["momentum_buffer"])
    assert d["GraphReplay"] == 6 and d["MarkStep"] == 6
    assert d["ExecuteComputation"] == 6        # one program per replay, nothing else
    assert d["UncachedCompile"] == 0 and d["CachedCompile"] == 0  # the hash was computed once, at capture


def test_a_capture_records_and_compiles_but_runs_nothing():
    w = next(_widths)
    data = batches(2, w)
    ref = mlp(w)
    lz = copy.deepcopy(ref).to(DEV)
    opt = sgd(lz)
    train_step(lz, opt, data[0][0].to(DEV), data[0][1].to(DEV))
    lazyxla.sync()
    before = [p.detach().cpu() for p in lz.parameters()]
    mom = [opt.state[p]["momentum_buffer"].cpu() for p in lz.parameters()]
    sx, sy = data[1][0].to(DEV), data[1][1].to(DEV)
    opt.zero_grad(set_to_none=True)
    d = Delta("ExecuteComputation", "UncachedCompile", "GraphCapture")
    g = lazyxla.Graph()
    with lazyxla.graph(g):
        loss = train_step(lz, opt, sx, sy)
    assert d["ExecuteComputation"] == 0 and d["GraphCapture"] == 1
    assert d["UncachedCompile"] == 1  # the steady step was not seen before: compiled at capture
    for b, p in zip(before, lz.parameters()):
        assert torch.equal(p.detach().cpu(), b)  # every tensor keeps its pre-capture value
    for m, p in zip(mom, lz.parameters()):
        assert torch.equal(opt.state[p]["momentum_buffer"].cpu(), m)
    with pytest.raises(lazyxla.ExecutionError, match="has not been replayed yet"):
        loss.item()
    with pytest.raises(lazyxla.ExecutionError, match="has not been replayed yet"):
        lz[0].weight.grad.cpu()
    g.replay()
    assert loss.item() > 0 and lz[0].weight.grad.abs().sum().item() > 0


def test_the_captured_program_is_the_one_a_sync_compiles():
    # the same steady step synced lazily first: the capture finds its program by the same hash
    w = next(_widths)
    data = batches(4, w)
    lz = mlp(w).to(DEV)
    opt = sgd(lz)
    for i in range(2):
        opt.zero_grad(set_to_none=True)
        train_step(lz, opt, data[i][0].to(DEV), data[i][1].to(DEV))
        lazyxla.sync()
    sx, sy = data[2][0].to(DEV), data[2][1].to(DEV)
    opt.zero_grad(set_to_none=True)
    d = Delta("UncachedCompile", "CachedCompile")
    g = lazyxla.Graph()
    with lazyxla.graph(g):
        train_step(lz, opt, sx, sy)
    assert d["UncachedCompile"] == 0 and d["CachedCompile"] == 1
    assert g.graph_hash == lazyxla.debug.last_fold().hex


def test_a_replay_traces_no_op():
    # a replay's Python cost is per input, never per op: no op is traced (no LazyTracing sample)
    w = next(_widths)
    kept = _warm_and_capture(w, batches(2, w))  # the model and static tensors stay alive
    g = kept[4]
    met.metric_data("LazyTracing")  # flush the samples already taken
    n = samples("LazyTracing")
    for _ in range(5):
        g.replay()
    assert samples("LazyTracing") == n


def test_ops_recorded_between_replays_are_synced_first():
    w = next(_widths)
    data = batches(3, w)
    ref, ropt, lz, opt, g, sx, sy, sloss = _warm_and_capture(w, data)
    x, y = data[2]
    sx.copy_(x.to(DEV) * 1.0 + 0.0)  # pending IR: computed before the replay binds sx
    sy.copy_(y.to(DEV))
    g.replay()
    ropt.zero_grad(set_to_none=True)
    close(sloss.detach().cpu(), train_step(ref, ropt, x, y).detach())


def test_dropout_draws_new_numbers_each_replay_and_manual_seed_reproduces_the_lazy_path():
    w = next(_widths)
    data = batches(2, w)
    lz = mlp(w, dropout=0.5).to(DEV)
    lazy = copy.deepcopy(lz)
    sx = data[0][0].to(DEV)
    g = lazyxla.Graph()
    with torch.no_grad(), lazyxla.graph(g):
        out = lz(sx)
    g.replay()
    a = out.cpu()
    g.replay()
    b = out.cpu()
    assert not torch.equal(a, b)  # a new mask each replay
    lazyxla.manual_seed(7)
    g.replay()
    c = out.cpu()
    lazyxla.manual_seed(7)
    with torch.no_grad():
        want = lazy(sx)
    lazyxla.sync()
    assert torch.equal(c, want.cpu())  # the replay draws what the lazy step draws from that seed


def test_frozen_lists_python_numbers_with_the_users_line():
    w = next(_widths)
    _, _, _, _, g, _, _, _ = _warm_and_capture(w, batches(2, w))
    frozen = g.frozen()
    kinds = " | ".join(str(f) for f in frozen)
    assert "the Python number 0.1" in kinds  # SGD's lr (its fused step's: momentum is a setting of the node)
    assert all(f.where and f.where[0].endswith("test_replay.py") for f in frozen), kinds
    assert all(f.where[1] == train_step.__code__.co_firstlineno + 3 for f in frozen), kinds  # opt.step()


def test_a_tensor_uploaded_inside_the_capture_is_frozen_and_listed():
    x = torch.ones(3, device=DEV)
    g = lazyxla.Graph()
    with lazyxla.graph(g):
        y = x + torch.tensor([1.0, 2.0, 3.0]).to(DEV)
    (f,) = g.frozen()
    assert "uploaded or made inside the capture" in f.kind and f.value.tolist() == [1.0, 2.0, 3.0]
    g.replay()
    assert y.cpu().tolist() == [2.0, 3.0, 4.0]


# ---------------------------------------------------------------------------------------------
# Refusals: nothing runs, nothing changes
def _params(m):
    return [p.detach().cpu() for p in m.parameters()]


@pytest.mark.parametrize("read,words", [
    (lambda t: t.item(), r"\.item\(\)"),
    (lambda t: print(t), r"print\(\)/repr\(\)"),
    (lambda t: torch.nonzero(t), "aten::nonzero"),
    (lambda t: lazyxla.sync(), r"lazyxla\.sync\(\)"),
], ids=["item", "print", "cpu-fallback", "sync"])
def test_a_value_read_inside_a_capture_raises_at_the_users_line_and_changes_nothing(read, words):
    w = next(_widths)
    m = mlp(w).to(DEV)
    opt = sgd(m)
    x, y = batches(1, w)[0]
    x, y = x.to(DEV), y.to(DEV)
    train_step(m, opt, x, y)  # warm up: the momentum buffers appear
    lazyxla.sync()
    opt.zero_grad(set_to_none=True)  # the capture makes the gradients
    before = _params(m)
    d = Delta("ExecuteComputation")
    g = lazyxla.Graph()
    with pytest.raises(lazyxla.LazyXlaError, match=words) as e:
        with lazyxla.graph(g):
            loss = train_step(m, opt, x, y)
            read(loss)  # the line the message names
    assert "test_replay.py:" in str(e.value) and "inside a capture" in str(e.value)
    assert d["ExecuteComputation"] == 0
    assert all(torch.equal(a, b) for a, b in zip(before, _params(m)))
    with pytest.raises(lazyxla.LazyXlaError, match="nothing was captured"):
        g.replay()
    with pytest.raises(lazyxla.ExecutionError, match="capture that failed"):
        m[0].weight.grad.cpu()  # made inside the failed capture: no value, never a silent one


def test_adam_with_its_step_count_on_the_cpu_is_refused_in_pytorchs_words():
    w = next(_widths)
    m = mlp(w).to(DEV)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    x, y = (t.to(DEV) for t in batches(1, w)[0])
    train_step(m, opt, x, y)
    lazyxla.sync()
    before = _params(m)
    with pytest.raises(RuntimeError, match="Attempting lazyxla graph capture of step\\(\\) for an instance of Adam "
                                           "but param_groups' capturable is False"):
        with lazyxla.graph(lazyxla.Graph()):
            train_step(m, opt, x, y)
    assert all(torch.equal(a, b) for a, b in zip(before, _params(m)))


def test_capturing_an_optimizers_first_step_is_refused():
    # SGD's first step makes its momentum buffers: replayed, every step would be a first step
    w = next(_widths)
    m = mlp(w).to(DEV)
    opt = sgd(m)
    x, y = (t.to(DEV) for t in batches(1, w)[0])
    before = _params(m)
    with pytest.raises(lazyxla.LazyXlaError, match=r"SGD.step\(\) made its state inside the capture .*test_replay.py:"):
        with lazyxla.graph(lazyxla.Graph()):
            train_step(m, opt, x, y)
    assert all(torch.equal(a, b) for a, b in zip(before, _params(m)))


def test_capturable_adam_with_a_scheduled_tensor_lr_replays_like_eager():
    w = next(_widths)
    data = batches(7, w)
    ref = mlp(w)
    lz = copy.deepcopy(ref).to(DEV)
    ropt = torch.optim.Adam(ref.parameters(), lr=torch.tensor(0.01), capturable=False)
    opt = torch.optim.Adam(lz.parameters(), lr=torch.tensor(0.01, device=DEV), capturable=True)
    rsched = torch.optim.lr_scheduler.StepLR(ropt, step_size=2, gamma=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    x0, y0 = data[0]
    train_step(ref, ropt, x0, y0)
    rsched.step()
    train_step(lz, opt, x0.to(DEV), y0.to(DEV))
    lazyxla.sync()
    sched.step()
    sx, sy = data[1][0].to(DEV), data[1][1].to(DEV)
    ropt.zero_grad(set_to_none=True)
    opt.zero_grad(set_to_none=True)
    g = lazyxla.Graph()
    with lazyxla.graph(g):
        sloss = train_step(lz, opt, sx, sy)
    for i in range(1, 7):
        x, y = data[i]
        sx.copy_(x.to(DEV))
        sy.copy_(y.to(DEV))
        g.replay()
        sched.step()  # fill_ on the device lr: the next replay binds the new value
        ropt.zero_grad(set_to_none=True)
        want = train_step(ref, ropt, x, y)
        rsched.step()
        close(sloss.detach().cpu(), want.detach(), 1e-4)
    for p_ref, p in zip(ref.parameters(), lz.parameters()):
        close(p.detach().cpu(), p_ref.detach(), 1e-4)


def test_a_changed_python_lr_is_refused_not_replayed_stale():
    w = next(_widths)
    _, _, lz, opt, g, sx, sy, _ = _warm_and_capture(w, batches(2, w))
    g.replay()
    opt.param_groups[0]["lr"] = 0.05
    before = _params(lz)
    with pytest.raises(lazyxla.LazyXlaError, match=r"SGD.param_groups\[0\]\['lr'\] is 0.05 now, 0.1 at the capture"):
        g.replay()
    assert all(torch.equal(a, b) for a, b in zip(before, _params(lz)))


def test_model_eval_after_the_capture_is_refused():
    w = next(_widths)
    _, _, lz, opt, g, sx, sy, _ = _warm_and_capture(w, batches(2, w))
    lz.eval()
    with pytest.raises(lazyxla.LazyXlaError, match="training is False, but the step was captured with True"):
        g.replay()
    lz.train()
    g.replay()


def test_a_rebound_or_freed_tensor_is_a_clear_error_never_a_stale_buffer():
    w = next(_widths)
    _, _, lz, opt, g, sx, sy, _ = _warm_and_capture(w, batches(2, w))
    old = lz[0].weight.data
    lz[0].weight.data = torch.zeros_like(old)
    with pytest.raises(lazyxla.LazyXlaError, match="rebound to another storage"):
        g.replay()
    lz[0].weight.data = old
    g.replay()  # bound again as captured
    x = torch.ones(3, device=DEV)
    g2 = lazyxla.Graph()
    with lazyxla.graph(g2):
        x.mul_(2)
    del x
    with pytest.raises(lazyxla.LazyXlaError, match="was freed after the capture"):
        g2.replay()


def test_a_failed_replay_raises_with_the_graph_hash_and_loses_nothing():
    x = torch.ones(4, device=DEV) * 3
    w = torch.ones(4, device=DEV)
    lazyxla.sync()
    g = lazyxla.Graph()
    with lazyxla.graph(g):
        w.add_(x)
    g.replay()
    assert w.cpu().tolist() == [4.0] * 4
    x._state.storage.data.get().delete()  # the input's buffer is gone (as a lost device would make it)
    with pytest.raises(lazyxla.ExecutionError, match=g.graph_hash):
        g.replay()
    assert w.cpu().tolist() == [4.0] * 4  # the written tensor kept its value


def test_a_capture_cannot_nest_and_a_graph_captures_once():
    g = lazyxla.Graph()
    x = torch.ones(2, device=DEV)
    with lazyxla.graph(g):
        with pytest.raises(lazyxla.LazyXlaError, match="captures do not nest"):
            with lazyxla.graph(lazyxla.Graph()):
                pass
        x.add_(1)
    with pytest.raises(lazyxla.LazyXlaError, match="already holds a captured step"):
        with lazyxla.graph(g):
            pass
    g.replay()
    assert x.cpu().tolist() == [2.0, 2.0]


# ---------------------------------------------------------------------------------------------
# 2. lazyxla.compile(fn, replay=True)
def _step_fn(model, opt):
    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def _twin_steps(w):
    """The same model on the CPU and the device, and each one's step function."""
    ref = mlp(w)
    lz = copy.deepcopy(ref).to(DEV)
    return ref, lz, _step_fn(ref, sgd(ref)), _step_fn(lz, sgd(lz))


def test_the_step_form_runs_lazily_then_captures_then_replays_like_eager():
    w = next(_widths)
    data = batches(8, w)
    ref, lz, rstep, inner = _twin_steps(w)
    step = lazyxla.compile(inner, replay=True)
    d = Delta("GraphCapture", "GraphReplay", "GraphReplayCheck", "UncachedCompile")
    losses = []
    for x, y in data:
        losses.append(step(x.to(DEV), y.to(DEV)))  # each call returns its own tensor
        close(losses[-1].cpu(), rstep(x, y))
    assert d["GraphCapture"] == 1
    assert d["GraphReplay"] == len(data) - 1 and d["GraphReplayCheck"] == 2
    assert d["UncachedCompile"] == 1       # SGD momentum's first step is its steady one (zero buffers as data)
    assert len({float(v.item()) for v in losses}) == len(losses)  # no result overwritten by a later call
    for p_ref, p in zip(ref.parameters(), lz.parameters()):
        close(p.detach().cpu(), p_ref.detach())


def test_the_step_form_binds_cpu_batches_uploaded_inside_it():
    w = next(_widths)
    data = batches(6, w)
    _, _, rstep, inner = _twin_steps(w)
    step = lazyxla.compile(lambda x, y: inner(x.to(DEV), y.to(DEV)), replay=True)
    for x, y in data:
        close(step(x, y).cpu(), rstep(x, y))  # a new batch every call, never the captured one


def test_a_new_argument_shape_captures_again_and_the_log_says_why():
    w = next(_widths)
    lz = mlp(w).to(DEV)
    step = lazyxla.compile(_step_fn(lz, sgd(lz)), replay=True)
    for n in (6, 6, 6, 6, 9, 9, 9):
        x, y = batches(1, w, batch=n)[0]
        step(x.to(DEV), y.to(DEV))
    rec = [r for r in lazyxla.debug.recompile_log() if r.site == "replay"][-1]
    assert "new arguments (f32[9, %d], s64[9]) (was (f32[6, %d], s64[6]))" % (w, w) in rec.text, rec.text


def test_a_check_finds_python_that_depends_on_a_value_the_capture_froze():
    x = torch.ones(3, device=DEV)
    state = {"scale": 2.0, "branch": False}

    @lazyxla.compile(replay=True)
    def scaled(t):
        return t * state["scale"] + (1 if state["branch"] else 0)

    scaled(x)
    scaled(x)  # captured
    state["scale"] = 3.0  # the same graph (a scalar is device data), another frozen value
    with pytest.raises(lazyxla.LazyXlaError, match=r"a frozen value changed: the Python number 3.0.*is 3.0 now and "
                                                   r"was 2.0 at the capture"):
        scaled(x)
    state["scale"] = 2.0
    assert scaled(x).cpu().tolist() == [2.0] * 3
    state["branch"] = True  # another graph: the check names the merge site and the line
    with pytest.raises(lazyxla.LazyXlaError, match=r"the graph changed: tensors: .*test_replay.py:"):
        scaled(x)


def test_the_step_form_captures_again_after_model_eval():
    w = next(_widths)
    lz = mlp(w).to(DEV)
    x, y = (t.to(DEV) for t in batches(1, w)[0])
    step = lazyxla.compile(lambda x: lz(x).sum(), replay=True, check_every=0)
    for _ in range(5):
        step(x)
    d = Delta("GraphRecapture")
    lz.eval()
    step(x)
    assert d["GraphRecapture"] == 1
    rec = [r for r in lazyxla.debug.recompile_log() if r.site == "replay"][-1]
    assert "training is False, but the step was captured with True" in rec.text


def test_check_every_keeps_checking():
    x = torch.ones(2, device=DEV)
    step = lazyxla.compile(lambda t: t + 1, replay=True, check_every=3)
    d = Delta("GraphReplayCheck")
    for _ in range(2 + 2 + 9):  # lazy, capture, 2 first checks, then 9 replays: 3 more checks
        step(x)
    assert d["GraphReplayCheck"] == 2 + 3


# ---------------------------------------------------------------------------------------------
# 3. make_graphed_callables
def test_make_graphed_callables_forward_and_backward_like_eager():
    w = next(_widths)
    data = batches(5, w)
    ref = mlp(w)
    lz = copy.deepcopy(ref).to(DEV)
    ropt, opt = sgd(ref), sgd(lz)
    sample = torch.randn(6, w).to(DEV)
    graphed = lazyxla.make_graphed_callables(lz, (sample,))
    assert graphed is lz
    d = Delta("GraphReplay")
    for x, y in data:
        ropt.zero_grad()
        opt.zero_grad()
        want = F.cross_entropy(ref(x), y)
        want.backward()
        ropt.step()
        got = F.cross_entropy(lz(x.to(DEV)), y.to(DEV))
        got.backward()
        opt.step()
        lazyxla.sync()
        close(got.detach().cpu(), want.detach())
    assert d["GraphReplay"] == 2 * len(data)  # a forward and a backward replay per step
    for p_ref, p in zip(ref.parameters(), lz.parameters()):
        close(p.detach().cpu(), p_ref.detach())
    lz.eval()  # not the mode it was captured in: the module's own forward runs
    with torch.no_grad():
        close(lz(data[0][0].to(DEV)).cpu(), ref.eval()(data[0][0]))
    lazyxla.wait_device_ops()  # no program of the graphing failed on the way


# ---------------------------------------------------------------------------------------------
# The same program as a sync's: in the persistent cache; step closures
def test_a_capture_in_a_new_process_loads_its_program_from_the_persistent_cache(tmp_path):
    import textwrap
    script = textwrap.dedent("""
        import json, torch, torch.nn as nn, torch.nn.functional as F
        import lazyxla, lazyxla.debug.metrics as met
        D = lazyxla.device()
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(7, 9), nn.ReLU(), nn.Linear(9, 3)).to(D)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        x, y = torch.randn(5, 7).to(D), torch.tensor([0, 1, 2, 0, 1]).to(D)
        def step():
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            return loss
        step()
        lazyxla.sync()
        c = {k: met.counter_value(k) or 0 for k in ("UncachedCompile", "PersistentCacheHit")}
        g = lazyxla.Graph()
        with lazyxla.graph(g):
            loss = step()
        g.replay()
        print(json.dumps({"loss": loss.item(), "hash": g.graph_hash,
                          **{k: (met.counter_value(k) or 0) - v for k, v in c.items()}}))
    """)
    runs = json_runs(script, times=2, XLA_PERSISTENT_CACHE_PATH=str(tmp_path / "cache"))
    assert runs[0]["UncachedCompile"] == 1 and runs[0]["PersistentCacheHit"] == 0
    assert runs[1]["UncachedCompile"] == 0 and runs[1]["PersistentCacheHit"] == 1  # found on disk by its hash
    assert runs[0]["hash"] == runs[1]["hash"] and runs[0]["loss"] == runs[1]["loss"]


def test_a_step_closure_added_inside_the_capture_runs_after_every_replay():
    x = torch.ones(2, device=DEV)
    seen = []
    g = lazyxla.Graph()
    with lazyxla.graph(g):
        x.add_(1)
        lazyxla.add_step_closure(lambda t: seen.append(t.cpu().tolist()), args=(x,))
    assert seen == []
    for _ in range(3):
        g.replay()
    assert seen == [[2.0, 2.0], [3.0, 3.0], [4.0, 4.0]]


def test_a_replayed_decode_step_gives_eagers_tokens_with_no_compile_per_token():
    from test_compile import _StaticCacheLM
    torch.manual_seed(0)
    ref = _StaticCacheLM().eval()
    lz = copy.deepcopy(ref).to(DEV)

    def greedy(model, device, step, n=12):
        tok, pos, out = torch.tensor([[3]], device=device), torch.tensor([0], device=device), []
        with torch.no_grad():
            for _ in range(n):
                tok, pos = step(model, tok, pos)
                out.append(tok)
        return [int(t.item()) for t in out]

    def decode(model, tok, pos):
        return model(tok, pos).argmax(-1, keepdim=True), pos + 1

    want = greedy(ref, "cpu", decode)
    d = Delta("UncachedCompile", "GraphReplay")
    step = lazyxla.compile(lambda tok, pos: decode(lz, tok, pos), replay=True)
    compiles = []
    got = greedy(lz, DEV, lambda model, tok, pos: compiles.append(cnt("UncachedCompile")) or step(tok, pos))
    assert got == want
    assert compiles[-1] == compiles[3], compiles  # nothing compiles once captured, whatever the length
    assert d["GraphReplay"] == 11
    close(lz.k1.cpu(), ref.k1)  # the cache writes landed in the model's buffers


def test_a_replay_donates_what_a_sync_donates():
    # the weights and momentum are written by the step: their old buffers go into the program
    w = next(_widths)
    kept = _warm_and_capture(w, batches(2, w))
    lz, g = kept[2], kept[4]
    g.replay()
    lazyxla.wait_device_ops()
    old = lz[0].weight._state.storage.data.get()
    d = Delta("GraphReplay")
    g.replay()
    lazyxla.wait_device_ops()
    assert d["GraphReplay"] == 1 and old.is_deleted()
    assert torch.isfinite(lz[0].weight.cpu()).all()  # the tensor holds the program's new buffer


def test_a_0d_cpu_tensor_inside_the_capture_is_frozen_and_listed():
    x = torch.ones(3, device=DEV)
    g = lazyxla.Graph()
    with lazyxla.graph(g):
        y = x * torch.tensor(2.5)  # a CPU scalar tensor: uploaded as the capture sees it
    assert [str(f) for f in g.frozen()] == [f"a tensor uploaded or made inside the capture f32[] = 2.5, used by "
                                            f"aten::mul.Tensor at test_replay.py:{g.frozen()[0].where[1]}"]
    g.replay()
    assert y.cpu().tolist() == [2.5] * 3


def test_captures_are_bounded_then_new_signatures_run_lazily():
    f = lazyxla.compile(lambda t: t * 2, replay=True)
    f.max_captures = 2
    d = Delta("GraphCapture", "GraphReplayLazyCall")
    for n in (3, 4, 5):
        for _ in range(2):
            assert f(torch.ones(n, device=DEV)).cpu().tolist() == [2.0] * n
    assert d["GraphCapture"] == 2 and d["GraphReplayLazyCall"] == 1  # the third shape's second call


def test_the_check_interval_comes_from_the_environment():
    code = ("import torch, lazyxla, lazyxla.debug.metrics as met\n"
            "f = lazyxla.compile(lambda t: t + 1, replay=True)\n"
            "x = torch.ones(2, device=lazyxla.device())\n"
            "for _ in range(2 + 2 + 8): f(x)\n"
            "print(met.counter_value('GraphReplayCheck'))\n")
    (checks,) = json_runs(code, LAZYXLA_REPLAY_CHECK_EVERY="4")
    assert checks == 4  # the first two replays, then replays 6 and 10


def test_every_call_after_the_warmup_ends_one_step_so_sampling_repeats_after_manual_seed():
    """warmup=0 captures at the first call; captured, checked and replayed calls each end one
    step (a capture with nothing pending before it adds none), so the numbers a step draws
    after manual_seed do not depend on which of them a call was."""
    w = next(_widths)
    probs = torch.softmax(torch.randn(3, w), dim=-1).to(DEV)
    lazyxla.sync()

    def draw(p):
        return torch.multinomial(p, 2, replacement=True)

    lazyxla.manual_seed(11)
    step = lazyxla.compile(draw, replay=True, warmup=0)
    d = Delta("MarkStep", "GraphCapture", "GraphReplayCheck", "GraphReplay")
    first = [step(probs).cpu() for _ in range(5)]  # captured, two checked, two replayed
    assert d["GraphCapture"] == 1 and d["GraphReplayCheck"] == 2 and d["GraphReplay"] == 5
    assert d["MarkStep"] == 5
    lazyxla.manual_seed(11)
    again = [step(probs).cpu() for _ in range(5)]  # replayed, every one
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    assert len({tuple(t.flatten().tolist()) for t in first}) > 1  # each step drew new numbers
