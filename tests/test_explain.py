"""R15 / issue 5: every uncached compile after the first says why, and torch_xla's
PT_XLA_DEBUG_LEVEL output."""
import inspect
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import lazyxla
import lazyxla.debug as dbg

DEV = lazyxla.device()
HERE = os.path.basename(__file__)
pytestmark = pytest.mark.usefixtures("exact_shapes")  # explanations of exact-shape keys: fresh sizes per test


def new_records(fn):
    n = len(dbg.recompile_log())
    fn()
    return dbg.recompile_log()[n:]


def settle():
    lazyxla.sync()
    lazyxla.wait_device_ops()


def test_batch_size_change_names_the_input_shapes_and_the_line():
    w = torch.randn(29, 3).to(DEV)
    settle()
    lines = {}

    def run():
        for bs in (8, 8, 5):
            x = torch.randn(bs, 29).to(DEV)
            lines["mm"] = inspect.currentframe().f_lineno + 1
            y = (x @ w).relu().sum()  # noqa: F841
            lazyxla.sync()
    recs = new_records(run)
    assert len(recs) == 2  # bs 8 compiles once, bs 5 once more
    r = recs[-1]
    assert r.site == "tensors"
    assert "f32[5, 29]" in r.text and "f32[8, 29]" in r.text
    assert f"{HERE}:{lines['mm']}" in r.text
    assert r.where[1] == lines["mm"]
    assert r.closest == recs[0].hash and r.compile_ms > 0


def test_sequence_length_change():
    emb = torch.nn.Embedding(50, 6).to(DEV)
    settle()

    def run():
        for T in (7, 9):
            ids = torch.randint(0, 50, (2, T)).to(DEV)
            emb.zero_grad()
            emb(ids).mean().backward()
            lazyxla.sync()
    r = new_records(run)[-1]
    assert r.site == "tensors" and "s64[2, 9]" in r.text and "s64[2, 7]" in r.text


def test_value_read_then_sync_is_force_ltc_data():
    a = torch.ones(31).to(DEV)
    settle()

    def run():
        b = a * 3 + 2
        print(b)  # a value read: compiles with force_ltc_data=false
        lazyxla.sync()  # the same operations, force_ltc_data=true
    recs = new_records(run)
    assert recs[-1].site == "force_ltc_data"
    assert "value read" in recs[-1].text


def test_a_plus_b_then_a_plus_a_is_parameters():
    a, b = torch.ones(33).to(DEV), torch.ones(33).to(DEV)
    settle()

    def run():
        c = a + b  # noqa: F841
        lazyxla.sync()
        d = a + a  # noqa: F841
        lazyxla.sync()
    r = new_records(run)[-1]
    assert r.site == "parameters" and "parameter sequence" in r.text


def test_in_place_update_is_donation():
    t = torch.ones(35).to(DEV)
    settle()

    def run():
        u = t * 2  # noqa: F841  (t is not an output: nothing donated)
        lazyxla.sync()
        t.mul_(2)  # the same operation, but t is updated: its buffer is donated
        lazyxla.sync()
    r = new_records(run)[-1]
    assert r.site == "donation"


def test_plus_one_then_minus_one_names_both_ops():
    a = torch.ones(37).to(DEV)
    settle()

    def run():
        b = a + 1  # noqa: F841
        lazyxla.sync()
        c = a - 1  # noqa: F841
        lazyxla.sync()
    r = new_records(run)[-1]
    assert r.site == "tensors" and "aten::sub" in r.text and "aten::add" in r.text


def test_float32_then_bfloat16_names_the_dtypes():
    settle()

    def run():
        for dt in (torch.float32, torch.bfloat16):
            x = torch.ones(39, dtype=dt).to(DEV)
            y = (x * x).sum()  # noqa: F841
            lazyxla.sync()
    r = new_records(run)[-1]
    assert r.site == "tensors" and "bf16" in r.text and "f32" in r.text


def test_debug_print_of_an_intermediate_that_stays_alive_adds_a_tensor():
    w = torch.randn(41, 2).to(DEV)
    settle()
    kept = []

    def run():
        for step in range(2):
            x = torch.ones(3, 41).to(DEV)
            h = x @ w
            loss = h.relu().sum()  # noqa: F841
            if step == 1:
                kept.append(h.mean())  # a debug value kept alive past the sync
            lazyxla.sync()
    r = new_records(run)[-1]
    assert r.site == "tensors" and "aten::mean" in r.text and "pending tensors" in r.text


def _run(code, env):
    e = dict(os.environ, **env)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def test_explain_env_prints_each_record(tmp_path):
    code = """
        import torch, lazyxla
        d = lazyxla.device()
        for n in (3, 4):
            y = torch.ones(n).to(d) * 2
            lazyxla.sync()
    """
    r = _run(code, {"LAZYXLA_EXPLAIN_RECOMPILES": "1"})
    assert "lazyxla recompile #1" in r.stderr and "lazyxla recompile #2" in r.stderr
    assert "tensors changed" in r.stderr


def test_pt_xla_debug_level_blocks_and_file(tmp_path):
    log = tmp_path / "debug.txt"
    code = """
        import torch, lazyxla
        d = lazyxla.device()
        a = torch.ones(3).to(d)
        def step():
            b = a * 2
            lazyxla.sync()
            return b
        for _ in range(3):
            step()
        print((a + 5).sum().item())
    """
    _run(code, {"PT_XLA_DEBUG_LEVEL": "1", "PT_XLA_DEBUG_FILE": str(log)})
    text = log.read_text()
    assert text.count("Compilation Analysis: Compilation Cause") == 2
    assert "user lazyxla.sync" in text
    assert "most likely user code trying to access tensor value before lazyxla.sync" in text
    assert "Execution Analysis" not in text  # level 1: compiles only
    assert "Graph Hash: " in text and "Number of Graph Inputs: " in text and "  step (<string>:7)" in text
    log.unlink()
    _run(code, {"PT_XLA_DEBUG_LEVEL": "2", "PT_XLA_DEBUG_FILE": str(log)})
    text = log.read_text()
    assert text.count("Execution Analysis: Execution Cause") == 4  # 3 syncs + 1 read


def test_compile_too_frequent_warning():
    code = """
        import torch, lazyxla
        d = lazyxla.device()
        for n in range(1, 14):
            y = torch.ones(n).to(d) * 2
            lazyxla.sync()
    """
    # one program per length, as torch_xla: its warning
    r = _run(code, {"PT_XLA_DEBUG_LEVEL": "1", "LAZYXLA_DYNAMIC_BUCKETS": "off"})
    assert "pt-xla-profiler: CompileTime too frequent: 11 counts during 11 steps" in r.stderr
    # by default the length becomes dynamic: one padded program per bound (8, 16), no warning
    r = _run(code, {"PT_XLA_DEBUG_LEVEL": "1"})
    assert "CompileTime too frequent" not in r.stderr
    assert r.stderr.count("Compilation Analysis: Compilation Cause") == 3  # n=1 exact, bounds 8 and 16
    assert "Dynamic Shape Analysis: dimension 0 of input 1 (f32[2], used at <string>:5) is dynamic" in r.stderr
    assert "padded to 8" in r.stderr and "grows from 8 to 16 (size 9)" in r.stderr


def test_every_op_of_a_training_step_keeps_the_users_line():
    """Each recorded node of a step (forward, autograd's backward, the optimizer's update) names
    the user's line that caused it: what explanations and the fold page show. A tracer that
    captured lines lazily or skipped them would fail here."""
    from lazyxla.keys.collect import Graph
    from lazyxla.run.storage import pending
    settle()
    D = lazyxla.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).to(D)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(5, 4).to(D), torch.tensor([0, 1, 2, 0, 1]).to(D)
    lines = {}
    lines["forward"] = inspect.currentframe().f_lineno + 1
    loss = torch.nn.functional.cross_entropy(model(x), y)
    lines["backward"] = inspect.currentframe().f_lineno + 1
    loss.backward()
    lines["step"] = inspect.currentframe().f_lineno + 1
    opt.step()
    _, roots = pending()
    ops = [n for n in Graph([r for _, r in roots]).post if n.data is None]
    assert len(ops) > 20
    where = {(os.path.basename(n.where[0]), n.where[1]) if n.where else None for n in ops}
    here = os.path.basename(__file__)
    assert where == {(here, line) for line in lines.values()}, where
    lazyxla.sync()


def test_a_graph_that_grows_read_after_read_says_nothing_was_synced():
    """A loop that reads a value every iteration and never syncs (HF's generate does) compiles a
    larger program each time: the record says the graph grew, names the key it grew from and
    says what to do."""
    dev = lazyxla.device()
    x = torch.ones(8).to(dev)
    lazyxla.sync()
    n = len(lazyxla.debug.recompile_log())
    for _ in range(4):
        x = torch.tanh(x * 1.5 + 0.25)
        float(x.sum())
    recs = lazyxla.debug.recompile_log()[n:]
    assert len(recs) == 4
    for prev, rec in zip(recs[1:], recs[2:]):
        assert rec.closest == prev.hash
        assert rec.text.startswith("The graph grew: it holds ")
        assert f"operations below key {prev.hash[:16]}" in rec.text
        assert "lazyxla.sync() once per iteration" in rec.text
    lazyxla.sync()


def test_the_closest_key_is_the_exhaustive_searchs_and_costs_few_tree_walks(monkeypatch):
    """Finding the closest earlier key does not walk the IR of every earlier key: the 41st
    compile of a process (six roots, as a model's parameters) compares trees with a few of its
    40 earlier keys, and picks the key that comparing with all of them picks. (Comparing with
    all of them made each compile slower as a process's history grew: a 2-layer GPT-2's three
    steps took 37 s after a few hundred tests' keys, 7 s alone.)"""
    from lazyxla.debug import explain
    xs = [torch.randn(3, 7).to(DEV) for _ in range(6)]
    settle()
    ops = (torch.tanh, torch.sin, torch.exp, torch.relu)

    def six_roots(k, last=None):
        ys = [ops[(k // (j + 1)) % 4](x) for j, x in enumerate(xs)]
        if last is not None:
            ys[-1] = last(ys[-1])
        lazyxla.sync()
        return ys
    for k in range(40):
        six_roots(k)
    seen = {}
    real = explain.closest

    def watched(trace, candidates):
        seen["args"] = (trace, list(candidates))
        return real(trace, candidates)
    monkeypatch.setattr(explain, "closest", watched)
    walks = []
    root_distance = explain._root_distance

    def walked(sa, sb):  # an IR walk under two unequal roots
        walks.append(sa.ingredient != sb.ingredient)
        return root_distance(sa, sb)
    monkeypatch.setattr(explain, "_root_distance", walked)
    recs = new_records(lambda: six_roots(0, last=torch.cos))  # key 0's graph, one root changed
    assert len(recs) == 1
    trace, candidates = seen["args"]
    assert len(candidates) >= 40
    searched = sum(walks)
    walks.clear()
    dists = [explain.distance(trace, c) for c in candidates]  # every one, as before
    assert 0 < searched < sum(walks) / 4
    best = max(k for k, d in enumerate(dists) if d == min(dists))
    assert recs[0].closest == candidates[best].hex
