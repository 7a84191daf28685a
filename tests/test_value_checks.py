"""Value checks folded into programs (``LAZYXLA_CHECK_VALUES``, on by default).

An index out of bounds or a bad probability cannot be seen while recording; XLA would clamp the
index and answer from the wrong place. Each indexing op adds a (flag, value) row to its
program's outputs, read when the program completes: reading the result raises PyTorch's
exception type with PyTorch's text, naming the op and the user's line; a later sync raises it
once the program finished; a wait raises it once. Off, no row and no error (and another key).
A replayed step and a program loaded from the persistent cache keep their checks; a training
step with the checks on gives eager's numbers.
"""
from __future__ import annotations

import gc
import inspect
import json
import os
import time

import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyxla.run import execution
from lazyhelp import in_a_child, json_runs

DEV = lazyxla.device()
HERE = os.path.basename(__file__)


def _x(d):
    return torch.arange(6.).reshape(3, 2).to(d)


def _i(d, *v):
    return torch.tensor(list(v)).to(d)


# op name -> (the call on tensors given, the lazy op's name in the message, text that must appear)
CASES = {
    "gather": (lambda d: torch.gather(_x(d), 0, _i(d, [5, 0])), "aten::gather",
               "index 5 is out of bounds for dimension 0 with size 3"),
    "gather_negative": (lambda d: torch.gather(_x(d), 0, _i(d, [-1, 0])), "aten::gather",
                        "index -1 is out of bounds for dimension 0 with size 3"),
    "scatter": (lambda d: _x(d).scatter(0, _i(d, [5, 0]), 1.0), "aten::scatter",
                "index 5 is out of bounds for dimension 0 with size 3"),
    "scatter_add": (lambda d: _x(d).scatter_add(0, _i(d, [5, 0]), torch.ones(1, 2).to(d)), "aten::scatter_add",
                    "index 5 is out of bounds for dimension 0 with size 3"),
    "scatter_reduce": (lambda d: _x(d).scatter_reduce(0, _i(d, [5, 0]), torch.ones(1, 2).to(d), "sum"),
                       "aten::scatter_reduce", "index 5 is out of bounds for dimension 0 with size 3"),
    "index_select": (lambda d: torch.index_select(_x(d), 0, _i(d, 5)), "aten::index_select",
                     "index out of range in self"),
    "take": (lambda d: torch.take(_x(d), _i(d, 23)), "aten::take",
             "out of range: tried to access index 23 on a tensor of 6 elements."),
    "take_negative": (lambda d: torch.take(_x(d), _i(d, -7)), "aten::take",
                      "out of range: tried to access index -7 on a tensor of 6 elements."),
    "index": (lambda d: _x(d)[_i(d, 5)], "aten::index", "index 5 is out of bounds for dimension 0 with size 3"),
    "index_negative": (lambda d: _x(d)[_i(d, -4)], "aten::index", "index -4 is out of bounds for dimension 0 with size 3"),
    "index_put": (lambda d: _x(d).index_put((_i(d, 5),), torch.tensor(1.).to(d)), "aten::index_put",
                  "index 5 is out of bounds for dimension 0 with size 3"),
    "index_add": (lambda d: _x(d).index_add(0, _i(d, 5), torch.ones(1, 2).to(d)), "aten::index_add",
                  "index 5 is out of bounds for dimension 0 with size 3"),
    "index_copy": (lambda d: _x(d).index_copy(0, _i(d, 5), torch.ones(1, 2).to(d)), "aten::index_copy",
                   "index_copy_(): index 5 is out of bounds for dimension 0 with size 3"),
    "index_fill": (lambda d: _x(d).index_fill(0, _i(d, -4), 1.), "aten::index_fill",
                   "index -4 is out of bounds for dimension 0 with size 3"),
    "index_reduce": (lambda d: _x(d).index_reduce(0, _i(d, 5), torch.ones(1, 2).to(d), "prod"), "aten::index_reduce",
                     "index out of range in self"),
    "put": (lambda d: _x(d).put(_i(d, 23), torch.tensor([1.]).to(d)), "aten::put",
            "out of range: tried to access index 23 on a tensor of 6 elements."),
    "embedding": (lambda d: F.embedding(_i(d, 1, 5), _x(d)), "aten::embedding", "index out of range in self"),
    "embedding_bag": (lambda d: F.embedding_bag(_i(d, 5), _x(d), _i(d, 0)), "aten::_embedding_bag",
                      "takes value 5 which is not in the valid range [0, 3)"),
    "cross_entropy": (lambda d: F.cross_entropy(torch.randn(2, 3).to(d), _i(d, 1, 7)), "lazyxla::cross_entropy",
                      "Target 7 is out of bounds."),
    "masked_scatter_source": (lambda d: torch.zeros(4).to(d).masked_scatter(_i(d, True, True, True, False),
                                                                            torch.ones(2).to(d)),
                              "aten::masked_scatter", "Number of elements of source < number of ones in mask"),
    "index_put_mask": (lambda d: torch.zeros(4, 2).to(d).index_put((_i(d, True, True, True, False),),
                                                                   torch.ones(2, 2).to(d)), "aten::index_put",
                       "shape mismatch: value tensor of shape [2, 2] cannot be broadcast to indexing result of "
                       "shape [3, 2]"),
    "searchsorted_sorter": (lambda d: torch.searchsorted(torch.tensor([1., 2, 3]).to(d), torch.tensor([2.]).to(d),
                                                         sorter=_i(d, 0, 5, 1)), "aten::searchsorted",
                            "torch.searchsorted(): sorter index out of range"),
    "multinomial_negative": (lambda d: torch.multinomial(torch.tensor([0.5, -0.1]).to(d), 1), "aten::multinomial",
                             "probability tensor contains either `inf`, `nan` or element < 0"),
    "multinomial_nan": (lambda d: torch.multinomial(torch.tensor([0.5, float("nan")]).to(d), 1), "aten::multinomial",
                        "probability tensor contains either `inf`, `nan` or element < 0"),
    "multinomial_zero": (lambda d: torch.multinomial(torch.zeros(2).to(d), 1), "aten::multinomial",
                         "invalid multinomial distribution (sum of probabilities <= 0)"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_bad_value_raises_as_eager_does(name):
    fn, op, text = CASES[name]
    with pytest.raises(Exception) as eager:
        fn("cpu")
    assert text in str(eager.value)
    out = fn(DEV)  # recorded: no value is known yet
    with pytest.raises(type(eager.value)) as lazy:
        out.cpu()  # the value read runs the program; its check row says the index was bad
    msg = str(lazy.value)
    assert isinstance(lazy.value, lazyxla.ExecutionError)
    assert text in msg and op in msg, msg
    assert "LAZYXLA_CHECK_VALUES=0" in msg
    # the line that recorded the op: the case's lambda in this file
    assert f"{HERE}:" in msg, msg
    del out, lazy, eager
    gc.collect()  # the bad tensor's pending IR would be in every later sync


def test_good_indices_give_eager_values():
    x = torch.randn(5, 4)
    idx = torch.tensor([[4, 0, 3, 1], [0, 0, 2, 4]])
    want = [torch.gather(x, 0, idx), x[torch.tensor([-1, 2])], torch.take(x, torch.tensor([-20, 19])),
            F.embedding(torch.tensor([[4, 0]]), x)]
    xd = x.to(DEV)
    got = [torch.gather(xd, 0, idx.to(DEV)), xd[torch.tensor([-1, 2]).to(DEV)],
           torch.take(xd, torch.tensor([-20, 19]).to(DEV)), F.embedding(torch.tensor([[4, 0]]).to(DEV), xd)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w)


def test_the_next_sync_raises_once_the_program_finished():
    x = torch.arange(6.).reshape(3, 2).to(DEV)
    lazyxla.sync()
    y = torch.gather(x, 0, torch.tensor([[7, 0]]).to(DEV))  # BAD
    bad_line = inspect.currentframe().f_lineno - 1
    lazyxla.sync()  # dispatched; the check is read when it completes
    deadline = time.monotonic() + 30
    while not all(c.done() for c in list(execution._inflight)):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    z = x * 2
    with pytest.raises(lazyxla.ExecutionError, match=f"aten::gather at {HERE}:{bad_line}: index 7 is out of bounds"):
        lazyxla.sync()
    lazyxla.wait_device_ops()  # reported once
    del y, z
    w = torch.arange(4, device=DEV) * 3
    assert w.tolist() == [0, 3, 6, 9]


def test_a_wait_raises_it_as_an_index_error():
    x = torch.arange(6.).to(DEV)
    y = torch.take(x, torch.tensor([9]).to(DEV))
    lazyxla.sync()
    with pytest.raises(IndexError, match="tried to access index 9 on a tensor of 6 elements"):
        lazyxla.wait_device_ops()
    del y


OFF = """
import json, torch, lazyxla
from lazyxla.xla import client as xla
x = torch.arange(6.).reshape(3, 2).to(lazyxla.device())
idx = torch.tensor([[5, 0]]).to(lazyxla.device())
y = torch.gather(x, 0, idx)
key = lazyxla.graph_hash([y])
print(json.dumps({"value": y.cpu().tolist(), "key": key,
                  "env": xla.compile_environment()["LAZYXLA_CHECK_VALUES"]}))
"""


@in_a_child("the variable and the key")
def test_the_switch_turns_the_checks_off():
    off, = json_runs(OFF, LAZYXLA_CHECK_VALUES="0")
    assert off["env"] == "0" and len(off["value"]) == 1  # no error: XLA's clamped gather, as before
    on_key = lazyxla.graph_hash([torch.gather(torch.arange(6.).reshape(3, 2).to(DEV), 0,
                                              torch.tensor([[5, 0]]).to(DEV))])
    assert on_key != off["key"]  # the checks are part of the program, so of its key


def test_a_replayed_step_keeps_its_checks():
    emb = torch.nn.Embedding(4, 3).to(DEV)

    @lazyxla.compile(replay=True)
    def look(tokens):
        return emb(tokens).sum()

    good = torch.tensor([0, 3]).to(DEV)
    for _ in range(3):
        v = look(good)
    torch.testing.assert_close(v.cpu(), emb.weight.detach().cpu()[[0, 3]].sum())
    bad = torch.tensor([1, 9]).to(DEV)
    with pytest.raises(IndexError, match="index 9"):
        look(bad).cpu()


PERSIST = """
import json, torch, lazyxla
w = torch.arange(12.).reshape(4, 3).to(lazyxla.device())
lazyxla.sync()
import sys
idx = torch.tensor([int(sys.argv[1]) if len(sys.argv) > 1 else 2]).to(lazyxla.device())
out = {}
try:
    out["value"] = torch.nn.functional.embedding(idx, w).sum().item()
except IndexError as e:
    out["error"] = str(e)
import lazyxla.debug.metrics as met
out["hits"] = met.counter_value("PersistentCacheHit") or 0
out["compiles"] = met.counter_value("UncachedCompile") or 0
print(json.dumps(out))
"""


@in_a_child("the persistent cache")
def test_a_program_from_the_persistent_cache_keeps_its_checks(tmp_path):
    script = PERSIST.replace("int(sys.argv[1]) if len(sys.argv) > 1 else 2", "IDX")
    first, = json_runs(script.replace("IDX", "2"), XLA_PERSISTENT_CACHE_PATH=str(tmp_path))
    assert first["value"] == 6 + 7 + 8 and first["compiles"] >= 1
    second, = json_runs(script.replace("IDX", "7"), XLA_PERSISTENT_CACHE_PATH=str(tmp_path))
    assert second["hits"] >= 1 and second["compiles"] == 0  # the same program, loaded
    assert "index out of range in self (index 7, 4 embeddings)" in second["error"]


def test_a_training_step_with_checks_gives_eager_numbers():
    def run(dev):
        torch.manual_seed(0)
        emb, head = torch.nn.Embedding(50, 8).to(dev), torch.nn.Linear(8, 5).to(dev)
        opt = torch.optim.Adam(list(emb.parameters()) + list(head.parameters()), lr=1e-2)
        g = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(4):
            tokens = torch.randint(0, 50, (6, 7), generator=g).to(dev)
            y = torch.randint(0, 5, (6,), generator=g).to(dev)
            opt.zero_grad()
            loss = F.cross_entropy(head(emb(tokens).mean(1)), y)
            loss.backward()
            opt.step()
            if dev != "cpu":
                lazyxla.sync()
            losses.append(loss)
        return [float(v.detach().cpu()) for v in losses], emb.weight.detach().cpu()

    eager_losses, eager_w = run("cpu")
    lazy_losses, lazy_w = run(DEV)
    assert lazy_losses == pytest.approx(eager_losses, rel=1e-5)
    torch.testing.assert_close(lazy_w, eager_w, rtol=1e-5, atol=1e-6)


def test_the_checks_are_on_by_default_and_listed_in_the_program():
    from lazyxla.debug import last_fold  # noqa: F401
    from lazyxla.compiler.cache import computation_cache
    x = torch.randn(7, 2).to(DEV)
    y = torch.index_select(x, 0, torch.tensor([6, 0]).to(DEV)).sum()
    lazyxla.sync()
    progs = [p for p in computation_cache().values() if any(c[0] == "aten::index_select" for c in p.checks)]
    assert progs, "no program lists its index_select check"
    op, where, text, kind = next(c for c in progs[-1].checks if c[0] == "aten::index_select")
    assert kind == "IndexError" and os.path.basename(where[0]) == HERE and "{value}" in text
    assert json.dumps(progs[-1].checks)  # what the persistent cache stores with the program
    del y


def test_opinfo_error_inputs_only_the_values_decide_all_raise():
    """PyTorch's OpInfo error inputs that no recording-time check can decide (an index out of
    bounds, a bad distribution) raise too, at the read (bench/error_inputs.py's runner)."""
    import importlib.util
    import re
    pytest.importorskip("expecttest")
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "error_inputs.py")
    spec = importlib.util.spec_from_file_location("bench_error_inputs_values", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    value_dependent = re.compile(r"out of bounds|probability tensor contains|invalid multinomial distribution")
    seen, silent = 0, []
    for op_i, j, name in bench.cases():
        rec = bench.run_case(op_i, j)
        bench._settle()
        if rec["outcome"] == "eager-accepts" or not value_dependent.search(rec["expected"]):
            continue
        seen += 1
        if rec["outcome"] != "raise":
            silent.append(f"{name}({rec['input']}): {rec['outcome']}")
        else:
            assert value_dependent.search(rec.get("error", "")), rec
    assert seen >= 17
    assert not silent, "\n".join(silent)
