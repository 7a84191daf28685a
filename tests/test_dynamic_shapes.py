"""Bounded dynamic shapes: a dimension whose size varies between steps is padded to a bound and
runs one program for every size up to it, exactly: values and gradients equal eager's, what
PyTorch sees is the real shape, and whatever an op would mix across the padding is masked
(lazyxla/lowering/padding.py) or the graph stays exact-shape, said in the recompile log."""
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyxla import dynamic
from lazyxla.dynamic import bounds, structure
from lazyxla.debug.explain import recompile_log
from lazyhelp import cnt

pytestmark = pytest.mark.usefixtures("nothing_pending")
DEV = lazyxla.device()
HERE = os.path.dirname(os.path.abspath(__file__))
LENGTHS = (5, 7, 11, 6, 13)   # 5 exact, 7 padded to 8, 11 to 16 (the bound grows), then both reused


@pytest.fixture(autouse=True)
def fresh_families():
    dynamic.reset()
    yield


def _step(fn, x, extra, on):
    xs = x.detach().to(DEV).requires_grad_() if on else x.detach().clone().requires_grad_()
    ex = [e.to(DEV) if on else e for e in extra]
    out = fn(xs, *ex)
    (out.float() * torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape).to(out.device)).sum().backward()
    if on:
        lazyxla.sync()
    return out.detach().cpu(), xs.grad.cpu()


def _inputs(L, b=3, h=4, seed=0):
    g = torch.Generator().manual_seed(seed + L)
    x = torch.randn(b, L, h, generator=g)
    lens = torch.randint(1, L + 1, (b,), generator=g)
    lens[0] = L
    mask = torch.arange(L)[None] < lens[:, None]
    ids = torch.randint(0, 10, (b, L), generator=g)
    return x, mask, ids


def _attention(x, mask):
    s = x @ x.transpose(1, 2) / math.sqrt(x.shape[-1])
    s = s.masked_fill(~mask[:, None, :], float("-inf"))
    return torch.softmax(s, -1) @ x


FAMILIES = {
    "reductions": (lambda x: x.sum(1) + x.mean(1) + x.var(1) + x.std(1, correction=0) + x.amax(1), ()),
    "mean of all": (lambda x: x.mean().reshape(1) * x.sum(), ()),
    "softmax": (lambda x: torch.softmax(x, 1) + torch.log_softmax(x * 2, 1), ()),
    "contraction": (lambda x: x.transpose(1, 2) @ x, ()),
    "cumsum": (lambda x: x.cumsum(1), ()),
    "from the end": (lambda x: x[:, -1] + x[:, -3:].sum(1) + x[:, :-1].mean(1) + x[:, 1:].amax(1), ()),
    "positions": (lambda x: x + torch.arange(x.shape[1], device=x.device)[None, :, None] * 0.1, ()),
    "layer norm and linear": (lambda x, w: F.layer_norm(x, (4,)) @ w, (torch.randn(4, 6),)),
    "attention with a padding mask": (_attention, ("mask",)),
    "masked mean pool": (lambda x, m: (x * m[..., None]).sum(1) / m.sum(1, keepdim=True), ("mask",)),
    "embedding": (lambda x, ids, e: x + e[ids], ("ids", torch.randn(10, 4))),
    "flattened cross entropy": (lambda x, ids: F.cross_entropy(x.reshape(-1, 4), (ids % 4).reshape(-1),
                                                                ignore_index=3).reshape(1), ("ids",)),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_varying_length_runs_one_program_per_bound_with_eagers_values_and_gradients(family):
    fn, extra_spec = FAMILIES[family]
    before = cnt("UncachedCompile")
    fallbacks = cnt("DynamicShapeFallback")
    for i, L in enumerate(LENGTHS):
        x, mask, ids = _inputs(L)
        extra = [mask if e == "mask" else ids if e == "ids" else e for e in extra_spec]
        want = _step(fn, x, extra, False)
        got = _step(fn, x, extra, True)
        assert got[0].shape == want[0].shape  # PyTorch sees the real shape
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5, msg=f"{family}, length {L}")
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5, msg=f"{family}, length {L} (gradient)")
    assert cnt("DynamicShapeFallback") == fallbacks
    assert cnt("UncachedCompile") - before == 3  # length 5 exact, then one padded program per bound (8, 16)


def test_a_smaller_size_runs_in_a_larger_bounds_program_until_its_padding_has_paid_a_compile():
    def fn(x, mask):  # attention, its own programs (no other test's in the cache)
        return _attention(x * 0.75, mask)

    def step(L):
        x, mask, _ = _inputs(L)
        got, want = _step(fn, x, [mask], True), _step(fn, x, [mask], False)
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5, msg=f"length {L}")
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5, msg=f"length {L} (gradient)")

    before, rents = cnt("UncachedCompile"), cnt("DynamicShapeBoundRent")
    for L in (5, 16):  # 5 exact, 16 padded to (its own bound) 16
        step(L)
    assert cnt("UncachedCompile") - before == 2
    for L in (7, 6, 7):  # their own bound (8) has no program: they run in bound 16's, compiling nothing
        step(L)
    assert cnt("UncachedCompile") - before == 2 and cnt("DynamicShapeBoundRent") - rents == 1
    fam, = [f for f in structure._FAMILIES.values() if f.programs]
    rent, = fam.rents.values()
    assert rent.own == (8,) and rent.host == (16,) and rent.runs == 3 and rent.share == 0.5
    fam.programs[(16,)].compile_s = rent.paid  # as if the padding paid so far had cost a whole compile
    step(7)  # still the bound-16 program; this run makes the size's own bound due
    assert cnt("UncachedCompile") - before == 2
    step(7)  # bound 8 compiled now
    assert cnt("UncachedCompile") - before == 3 and (8,) in fam.programs and not fam.rents
    assert "bound 8 gets its own program now: 4 run(s) in the program of bound 16" in recompile_log()[-1].text
    for L in (6, 7, 8, 5):  # every size up to 8 runs in its own bound's program now
        step(L)
    assert cnt("UncachedCompile") - before == 3


def test_a_sizes_own_bound_holds_it_with_at_most_a_quarter_of_padding(monkeypatch):
    sizes = range(1, 300)
    assert [dynamic.own_bound(n) for n in (1, 8, 9, 11, 17, 33, 41, 57, 64, 65, 200)] == \
        [8, 8, 10, 12, 20, 40, 48, 64, 64, 80, 224]
    assert all(n <= dynamic.own_bound(n) <= max(8, 1.25 * n) <= dynamic.bucket(n) * 1.25 for n in sizes)
    assert dynamic.own_bound(20, mark=50) == 50
    monkeypatch.setattr(bounds, "POLICY", "pow2")
    assert [dynamic.own_bound(n) for n in (9, 33, 200)] == [16, 64, 256]


def test_an_op_without_a_padding_rule_stays_exact_and_says_where():
    before = cnt("UncachedCompile")
    for L in (5, 7, 6):
        x = torch.randn(2, L)
        got = (x.to(DEV).sort(1).values * 2).cpu()   # sort along the varying dimension
        assert torch.equal(got, x.sort(1).values * 2)
    assert cnt("UncachedCompile") - before == 3   # one program per length, as before
    assert cnt("DynamicShapeFallback") >= 1
    text = " ".join(r.text for r in recompile_log()[-2:])
    assert "aten::sort at test_dynamic_shapes.py:" in text and "shapes stay exact" in text


def test_concatenating_along_the_varying_dimension_stays_exact():
    for L in (5, 7, 6):
        a, b = torch.randn(2, L), torch.randn(2, 3)
        assert torch.equal(torch.cat([a.to(DEV), b.to(DEV)], 1).cpu(), torch.cat([a, b], 1))


def test_mark_dynamic_sets_the_bound_and_a_larger_size_is_an_error():
    before = cnt("UncachedCompile")
    for L in (5, 7, 20, 31):
        x = torch.randn(2, L).to(DEV)
        lazyxla.mark_dynamic(x, 1, max=32)
        y = (x * 3).sum(1)
        lazyxla.sync()
        torch.testing.assert_close(y.cpu(), x.cpu().mul(3).sum(1), rtol=1e-5, atol=1e-6)
    assert cnt("UncachedCompile") - before == 2  # 5 exact, then every size up to 32 on one program
    with pytest.raises(ValueError, match="above max=32"):
        lazyxla.mark_dynamic(torch.randn(2, 40).to(DEV), 1, max=32)


def test_a_read_of_data_the_host_just_sent_at_a_new_length_compiles_nothing_and_waits_for_nothing():
    before, answered = cnt("UncachedCompile") + cnt("CachedCompile"), cnt("HostAnsweredRead")
    for L in (5, 9, 12, 7):
        m = torch.ones(2, L, dtype=torch.long)
        m[1, -2:] = 0
        md = m.to(DEV)
        assert bool(md.bool().all()) is False and bool((md[0] == 1).all()) is True  # transformers' check
        assert md.sum(1).tolist() == [L, L - 2]
        assert bool(md.bool().sum() == md.numel()) is False  # its fast_all: a number the trace made data
    assert cnt("UncachedCompile") + cnt("CachedCompile") - before == 4  # the first length's four reads (R5)
    assert cnt("HostAnsweredRead") - answered == 12    # every later length: on the host
    w = torch.ones(3).to(DEV) * 2   # computed on the device (a sync's program): a read of it runs one too
    lazyxla.sync()
    assert float((w * 3).sum()) == 18.0   # lookups, not compiles: another test in this worker may have compiled these
    assert cnt("UncachedCompile") + cnt("CachedCompile") - before == 6


def test_a_read_then_a_sync_of_fixed_shapes_still_compiles_twice():
    x = torch.randn(6).to(DEV)
    y = (x * 3 + 1).abs().sum()
    before = cnt("UncachedCompile")
    y.item()
    lazyxla.sync()
    assert cnt("UncachedCompile") - before == 2  # R5.2: two keys (force_ltc_data), kept with dynamic shapes on


def test_a_replayed_step_runs_the_padded_program_for_every_length():
    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def step(m, opt, x, y):
        loss = ((m(x).squeeze(-1) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    me, ml = make(), make().to(DEV)
    oe, ol = torch.optim.SGD(me.parameters(), lr=0.1), torch.optim.SGD(ml.parameters(), lr=0.1)
    f = lazyxla.compile(lambda x, y: step(ml, ol, x, y), replay=True)
    before = cnt("UncachedCompile")
    g = torch.Generator().manual_seed(0)
    for n in (5, 6, 7, 12, 13, 6, 9):
        for _ in range(3):
            x, y = torch.randn(n, 8, generator=g), torch.randn(n, generator=g)
            le, ll = step(me, oe, x, y), f(x.to(DEV), y.to(DEV))
            assert abs(float(ll) - float(le)) <= 1e-5 * max(1.0, abs(float(le))), n
    assert cnt("UncachedCompile") - before == 3   # 5 exact, then bounds 8 and 16
    assert cnt("GraphReplay") > 0


def _script(body, **env):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, **env))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


_LOOP = """
    import json, torch, lazyxla
    import lazyxla.debug.metrics as met
    from lazyxla.debug.explain import recompile_log
    w = torch.ones(4, 3).to(lazyxla.device())
    keys = []
    for L in (5, 6, 7, 12, 13):
        x = torch.arange(L * 4, dtype=torch.float32).reshape(L, 4).to(lazyxla.device())
        y = torch.softmax(x @ w, 0).sum(1)
        lazyxla.sync()
        assert torch.allclose(y.cpu(), torch.softmax(torch.arange(L * 4.).reshape(L, 4) @ torch.ones(4, 3), 0).sum(1))
    print(json.dumps({"compiles": met.counter_value("UncachedCompile") or 0,
                      "hits": met.counter_value("PersistentCacheHit") or 0,
                      "keys": sorted(r.hash for r in recompile_log())}))
"""


def test_buckets_setting_and_off():
    assert _script(_LOOP, LAZYXLA_DYNAMIC_BUCKETS="off")["compiles"] == 5            # one per length
    assert _script(_LOOP, LAZYXLA_DYNAMIC_BUCKETS="6,13")["compiles"] == 3           # 5 exact, bounds 6 and 13


def test_padded_programs_keep_their_keys_across_processes_and_in_the_persistent_cache(tmp_path):
    # the default bounds: 5 exact, then 8 and 16; another process computes the same 128-bit keys,
    # so it finds every program in the persistent cache and compiles nothing
    env = {"XLA_PERSISTENT_CACHE_PATH": str(tmp_path)}
    first, second = _script(_LOOP, **env), _script(_LOOP, **env)
    assert first["compiles"] == 3 and len(first["keys"]) == 3
    assert second["compiles"] == 0 and second["hits"] >= 3


def test_a_transformer_loop_with_variable_lengths_and_a_smaller_last_batch_trains_like_eager():
    def make():
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        return torch.nn.ModuleList([torch.nn.Embedding(30, 16),
                                    torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False),
                                    torch.nn.Linear(16, 3)])

    def step(m, opt, x, mask, y):
        h = m[1](m[0](x), src_key_padding_mask=~mask)
        pooled = (h * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        loss = F.cross_entropy(m[2](pooled), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    def run(lengths):
        g = torch.Generator().manual_seed(1)
        me, ml = make(), make().to(DEV)
        oe, ol = torch.optim.SGD(me.parameters(), lr=0.1), torch.optim.SGD(ml.parameters(), lr=0.1)
        before = cnt("UncachedCompile")
        for i, L in enumerate(lengths):
            b = 4 if i < len(lengths) - 1 else 2   # the last batch is smaller
            x = torch.randint(0, 30, (b, L), generator=g)
            lens = torch.randint(1, L + 1, (b,), generator=g)
            lens[0] = L
            mask = torch.arange(L)[None] < lens[:, None]
            y = torch.randint(0, 3, (b,), generator=g)
            le = step(me, oe, x, mask, y)
            ll = step(ml, ol, x.to(DEV), mask.to(DEV), y.to(DEV))
            lazyxla.sync()
            assert abs(ll.item() - le.item()) <= 1e-4 * abs(le.item()), (L, ll.item(), le.item())
        return cnt("UncachedCompile") - before

    few = run([9, 12, 10, 14, 11, 13])
    dynamic.reset()
    many = run([9 + (i * 7) % 8 for i in range(12)])  # every length of 9-16, and some again
    assert many <= few <= 6


@pytest.mark.skipif(not os.path.exists(os.path.join(HERE, "hf_scripts", "padded_trainer.py")), reason="script")
def test_the_trainer_with_padding_to_the_longest_compiles_a_few_programs_and_trains_like_eager(tmp_path):
    script = os.path.join(HERE, "hf_scripts", "padded_trainer.py")
    env = dict(os.environ, SENTENCES="32", TOKENIZERS_PARALLELISM="false")

    def one(lazy):
        cmd = [sys.executable] + (["-m", "lazyxla", "run"] if lazy else []) + [script, str(tmp_path / str(lazy))]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
        assert lines, r.stderr[-3000:]
        return json.loads(lines[-1][len("RESULT "):])

    eager, lazy = one(False), one(True)
    assert lazy["device"].startswith("lazyxla") and len(lazy["lengths"]) >= 6
    assert lazy["compiles"] <= 6, lazy
    for k, v in eager["losses"].items():
        assert abs(lazy["losses"][k] - v) <= 1e-4 * abs(v), (k, lazy["losses"][k], v)


def test_a_buffer_the_user_donates_is_donated_itself_not_a_padded_copy():
    for n in (5, 7, 9):  # the structure's length varies: padded from 7 on
        a, b = torch.ones(n).to(DEV), torch.ones(n).to(DEV)
        c = a + b
        lazyxla.sync()
    keep, gone = torch.ones(11).to(DEV), torch.ones(11).to(DEV)  # test_donation counts a compile of 13
    assert lazyxla.set_buffer_donation(gone, True)
    out = keep + gone
    lazyxla.sync()
    assert out.cpu().tolist() == [2.0] * 11 and c.cpu().tolist() == [2.0] * 9
    with pytest.raises(RuntimeError, match="donated"):
        gone.cpu()
