"""lazyxla.scan and lazyxla.scan_layers: one XLA loop whose body is traced once; values and every
gradient equal the Python loop's; what a loop cannot hold is refused at the user's line."""
import pytest
import torch
import torch.nn as nn

import lazyxla
from lazyxla.errors import LazyXlaError
from lazyhelp import cnt, distinct_kernels, last_program_text

DEV = lazyxla.device()
pytestmark = pytest.mark.usefixtures("nothing_pending")


def close(a, b, rtol=1e-5, atol=1e-5):
    torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=rtol, atol=atol)


def loop(fn, init, xs):
    carry, ys = init, []
    for i in range(xs.shape[0]):
        carry, y = fn(carry, xs[i])
        ys.append(y)
    return carry, torch.stack(ys)


def rnn(w):
    def fn(c, x):
        h = torch.tanh(c @ w + x)
        return h, h.sum(-1)
    return fn


def test_values_and_gradients_of_init_xs_and_closed_over_weights_equal_the_loops():
    torch.manual_seed(0)
    w, init, xs = torch.randn(8, 8) * 0.3, torch.randn(4, 8), torch.randn(6, 4, 8)
    ref = [t.clone().requires_grad_() for t in (w, init, xs)]
    c, ys = loop(rnn(ref[0]), ref[1], ref[2])
    (c.sum() + ys.pow(2).sum()).backward()
    lz = [t.to(DEV).requires_grad_() for t in (w, init, xs)]
    calls = cnt("ScanCall")
    lc, lys = lazyxla.scan(rnn(lz[0]), lz[1], lz[2])
    assert lc.shape == (4, 8) and lys.shape == (6, 4)
    (lc.sum() + lys.pow(2).sum()).backward()
    close(lc, c)
    close(lys, ys)
    for got, want in zip(lz, ref):
        close(got.grad, want.grad, rtol=1e-4, atol=1e-4)
    assert cnt("ScanCall") == calls + 1


def test_the_program_does_not_grow_with_the_length_and_holds_a_loop():
    w = (torch.randn(8, 8) * 0.3).to(DEV)
    init = torch.randn(4, 8).to(DEV)
    text = {}
    for n in (3, 24):
        xs = torch.randn(n, 4, 8).to(DEV)
        c, _ = lazyxla.scan(rnn(w), init, xs)
        text[n] = lazyxla.dump_hlo([c])
        lazyxla.sync()
    assert "while" in text[3].lower()
    assert abs(len(text[24]) - len(text[3])) < 200  # one body, whatever the length


def test_pytrees_and_no_y():
    torch.manual_seed(1)
    a, b, xs = torch.randn(3), torch.randn(2, 3), {"u": torch.randn(5, 3), "v": torch.randn(5)}

    def fn(c, x):
        p, q = c
        p = p * 0.9 + x["u"]
        return (p, q + x["v"] * p), None

    carry = (a, b)
    for i in range(5):
        carry, _ = fn(carry, {"u": xs["u"][i], "v": xs["v"][i]})
    (p, q), ys = lazyxla.scan(fn, (a.to(DEV), b.to(DEV)), {k: v.to(DEV) for k, v in xs.items()})
    assert ys is None
    close(p, carry[0])
    close(q, carry[1])


def test_random_ops_draw_new_numbers_every_iteration_and_follow_the_seed():
    def fn(c, x):
        return c + torch.rand(4, device=c.device), x * 2

    init, xs = torch.zeros(4).to(DEV), torch.ones(6, 2).to(DEV)
    lazyxla.manual_seed(3)
    c1, _ = lazyxla.scan(fn, init, xs)
    r1 = c1.cpu()
    lazyxla.manual_seed(3)
    c2, _ = lazyxla.scan(fn, init, xs)
    assert torch.equal(c2.cpu(), r1)  # the same seed, the same numbers
    lazyxla.manual_seed(3)  # the Python loop on the device draws the same numbers
    c = init
    for i in range(6):
        c, _ = fn(c, xs[i])
    close(c, r1)
    assert 0 < float(r1.min()) and float(r1.max()) < 6 and len(set(r1.tolist())) == 4


def test_scan_layers_trains_like_the_loop_and_every_layer_gets_its_gradients():
    def make():
        torch.manual_seed(0)
        return nn.ModuleList([nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 16), nn.GELU()) for _ in range(5)])

    ref, lz = make(), make().to(DEV)
    x = torch.randn(3, 16)
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt_l = torch.optim.SGD(lz.parameters(), lr=0.1)
    xd = x.to(DEV)
    for _ in range(3):
        h = x
        for layer in ref:
            h = layer(h)
        h.pow(2).mean().backward()
        out = lazyxla.scan_layers(lz, xd)
        out.pow(2).mean().backward()
        lazyxla.sync()  # every gradient in one program, not one program per read
        for (n, p), q in zip(ref.named_parameters(), lz.parameters()):
            close(q.grad, p.grad, rtol=1e-4, atol=1e-5)
        opt_r.step()
        opt_r.zero_grad()
        opt_l.step()
        opt_l.zero_grad()
        lazyxla.sync()
        close(out, h, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("stacked", [False, True], ids=["params", "stacked-params"])
def test_scan_layers_compiles_as_many_distinct_kernels_at_depth_32_as_at_depth_2(monkeypatch, stacked):
    """Each layer's slice of a stacked gradient is taken at a runtime index: XLA:CPU compiles each
    distinct kernel on its own, and slices at constant offsets (with each parameter's update
    fused in) made one distinct kernel per layer and parameter: six more per layer, 36 more at
    depth 8. (XLA fuses a stack of 2 a little otherwise than one of 8: 81, 84, 84, 80, 80
    distinct kernels at depths 2, 4, 8, 16, 32.) With the layers' parameters kept as rows of
    stacks (``param_stacks``, for deep models), ``scan_layers`` takes each stack as it is (a
    stack of its rows, a slice each, was 139 distinct kernels at depth 32 against 77)."""
    from lazyxla.compiler import compile as compile_
    from lazyxla.optim import param_stacks
    from lazyxla.rolling import settings as roll_settings
    # the same XLA options at both depths (the rule for small programs gives depth 2's its own)
    monkeypatch.setattr(compile_, "OPTION_RULES", tuple(r for r in compile_.OPTION_RULES if r[0][0] != "at most"))
    monkeypatch.setattr(param_stacks, "ENABLED", stacked)
    monkeypatch.setattr(roll_settings, "MIN_ITERATIONS", 2)
    monkeypatch.setattr(roll_settings, "WORK", "0")
    got = {}
    for depth in (2, 32):
        torch.manual_seed(0)
        layers = nn.ModuleList([nn.Sequential(nn.LayerNorm(24), nn.Linear(24, 40), nn.GELU(), nn.Linear(40, 24))
                                for _ in range(depth)]).to(DEV)
        made = cnt("ParamsStacked")
        opt = torch.optim.AdamW(layers.parameters(), lr=1e-3)
        assert (cnt("ParamsStacked") > made) == stacked
        x = torch.randn(5, 24).to(DEV)
        before = cnt("UncachedCompile")
        lazyxla.scan_layers(layers, x).pow(2).mean().backward()
        opt.step()
        lazyxla.sync()
        assert cnt("UncachedCompile") == before + 1
        got[depth] = distinct_kernels(last_program_text())
    assert got[32] - got[2] < 6, got  # less than one layer's worth


def test_what_a_loop_cannot_hold_is_refused_at_the_users_line():
    init, xs = torch.zeros(4).to(DEV), torch.ones(3, 4).to(DEV)
    with pytest.raises(LazyXlaError, match=r"reads a value on the host.*test_scan.py"):
        lazyxla.scan(lambda c, x: (c + x if float(x.sum()) > 0 else c, None), init, xs)
    with pytest.raises(LazyXlaError, match=r"changes carry leaf 0 from \[4\].*\[8\]"):
        lazyxla.scan(lambda c, x: (torch.cat([c, x]), None), init, xs)
    with pytest.raises(LazyXlaError, match=r"changes carry leaf 0 .*torch.float64"):
        lazyxla.scan(lambda c, x: ((c + x).double(), None), init, xs)
    outside = torch.zeros(4).to(DEV)

    def writes(c, x):
        outside.add_(x)
        return c + outside, None

    with pytest.raises(LazyXlaError, match=r"writes in place to a tensor from outside the loop.*test_scan.py"):
        lazyxla.scan(writes, init, xs)
    with pytest.raises(LazyXlaError, match=r"writes in place to its input \(xs leaf 0"):
        lazyxla.scan(lambda c, x: (c + x.mul_(2), None), init, xs)
    bns = [nn.BatchNorm1d(4).to(DEV) for _ in range(2)]  # training mode: running statistics written in place
    with pytest.raises(LazyXlaError, match="BatchNorm's running statistics"):
        lazyxla.scan_layers(bns, torch.ones(3, 4).to(DEV))
    with pytest.raises(ValueError, match="same leading size"):
        lazyxla.scan(lambda c, x: (c, None), init, (xs, torch.ones(2, 4).to(DEV)))
    with pytest.raises(ValueError, match="xs is empty"):
        lazyxla.scan(lambda c, x: (c, None), init, ())
    with pytest.raises(ValueError, match="mismatched keys"):
        lazyxla.scan_layers([nn.Linear(4, 4).to(DEV), nn.Sequential(nn.Linear(4, 4)).to(DEV)], init)
    with pytest.raises(ValueError, match="Shape mismatch: weight of layer 1 is \\[4, 4\\] torch.float64"):
        lazyxla.scan_layers([nn.Linear(4, 4).to(DEV), nn.Linear(4, 4).to(DEV).double()], init)
    assert torch.equal(init.cpu(), torch.zeros(4)) and torch.equal(outside.cpu(), torch.zeros(4))


def test_torch_xlas_names_under_lazyxla_run(tmp_path):
    import subprocess
    import sys
    script = tmp_path / "s.py"
    script.write_text(
        "import torch, torch.nn as nn\n"
        "import torch_xla.core.xla_model as xm\n"
        "from torch_xla.experimental.scan import scan\n"
        "from torch_xla.experimental.scan_layers import scan_layers\n"
        "d = xm.xla_device()\n"
        "c, ys = scan(lambda c, x: (c + x, c * x), torch.zeros(3, device=d), torch.ones(4, 3, device=d),\n"
        "             is_fn_pure=True)\n"
        "layers = nn.ModuleList([nn.Linear(3, 3) for _ in range(4)]).to(d)\n"
        "out = scan_layers(layers, c)\n"
        "print('OK', c.cpu().tolist(), ys.shape, out.shape)\n")
    r = subprocess.run([sys.executable, "-m", "lazyxla", "run", str(script)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "OK [4.0, 4.0, 4.0] torch.Size([4, 3]) torch.Size([3])" in r.stdout


def test_a_scans_graph_hash_is_the_same_in_every_process():
    from lazyhelp import json_here_and_in_a_process
    script = (
        "import json, torch, lazyxla\n"
        "d = lazyxla.device()\n"
        "w = torch.ones(4, 4).to(d)\n"
        "c, ys = lazyxla.scan(lambda c, x: (torch.tanh(c @ w + x), c.sum()), torch.zeros(4).to(d),\n"
        "                     torch.ones(5, 4).to(d))\n"
        "print(json.dumps([lazyxla.graph_hash([c, ys]), c.sum().item()]))\n")
    a, b = json_here_and_in_a_process(script)
    assert a == b and isinstance(a[0], str) and len(a[0]) == 32


def test_a_second_process_loads_the_scanned_training_step_from_the_persistent_cache(tmp_path):
    import os
    import subprocess
    import sys
    script = (
        "import torch, torch.nn as nn, lazyxla, lazyxla.debug.metrics as met\n"
        "d = lazyxla.device()\n"
        "torch.manual_seed(0)\n"
        "layers = nn.ModuleList([nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(3)]).to(d)\n"
        "opt = torch.optim.AdamW(layers.parameters(), lr=1e-2)\n"
        "x = torch.randn(4, 6).to(d)\n"
        "for _ in range(3):\n"
        "    loss = lazyxla.scan_layers(layers, x).pow(2).mean()\n"
        "    loss.backward(); opt.step(); opt.zero_grad(); lazyxla.sync()\n"
        "c = lambda k: met.counter_value(k) or 0\n"
        "print(round(float(loss), 7), c('UncachedCompile'), c('PersistentCacheHit'), c('PersistentCacheMiss'))\n")
    env = dict(os.environ, XLA_PERSISTENT_CACHE_PATH=str(tmp_path))
    outs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
            for _ in range(2)]
    assert all(r.returncode == 0 for r in outs), outs[-1].stderr[-2000:]
    first, second = (r.stdout.split() for r in outs)
    assert first[0] == second[0]                            # the same loss after 3 steps
    assert int(first[1]) >= 1 and int(first[3]) == int(first[1])
    assert second[1] == "0" and second[2] == first[3]       # every program loaded, none compiled


def test_a_recompile_explains_what_changed_inside_the_loop_body_at_its_line():
    import inspect
    import lazyxla.debug as dbg
    w = torch.ones(3, 3).to(DEV)

    def body(act):
        def fn(c, x):
            return act(c @ w + x), c.sum()  # the line the explanation names
        return fn

    for act in (torch.tanh, torch.sigmoid):
        c, ys = lazyxla.scan(body(act), torch.zeros(3).to(DEV), torch.ones(7, 3).to(DEV))
        lazyxla.sync()
    text = dbg.recompile_log()[-1].text
    line = inspect.getsourcelines(body)[1] + 2
    assert "inside the loop body of lazyxla::scan" in text, text
    assert "aten::sigmoid -> [f32[3]], before aten::tanh -> [f32[3]]" in text, text
    assert f"first difference at test_scan.py:{line}" in text, text
