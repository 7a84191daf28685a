"""R9: buffer donation at a step barrier, and its one safe condition."""
import subprocess
import sys
import textwrap

import pytest
import torch

import lazyxla
import lazyxla.debug as debug
import lazyxla.debug.metrics as met
from lazyxla.compiler.cache import computation_cache
from lazyhelp import in_a_child

DEV = lazyxla.device()
pytestmark = pytest.mark.usefixtures("exact_shapes")  # compile counts of fresh sizes: one program per shape


def ioac():
    d = met.metric_data("InputOutputAliasCount")
    return (d[0], d[1]) if d else (0, 0.0)


def last_compile_alias():
    n0, acc0 = ioac.before
    n1, acc1 = ioac()
    assert n1 == n0 + 1, "expected exactly one compile"
    return acc1 - acc0


def mark():
    lazyxla.sync()
    lazyxla.wait_device_ops()
    ioac.before = ioac()


def test_seed_counterexample_reads_twice_then_sync_advances_once():
    a = torch.full((5,), 1.0).to(DEV)
    lazyxla.sync()
    b = a + 0.9
    a += 0.4
    first, second = a.cpu(), a.cpu()  # value reads: never donate
    torch.testing.assert_close(first, torch.full((5,), 1.4))
    torch.testing.assert_close(second, first)
    lazyxla.sync()
    torch.testing.assert_close(a.cpu(), torch.full((5,), 1.4))
    torch.testing.assert_close(b.cpu(), torch.full((5,), 1.9))


def test_in_place_updates_are_donated_and_counted_at_compile():
    t1 = torch.ones(7).to(DEV)
    t2 = torch.ones(7).to(DEV)
    mark()
    t3 = t1 + t2
    t1 *= 2
    t2 += 2
    lazyxla.sync()
    assert last_compile_alias() == 2.0
    assert len(computation_cache().values()[-1].donated) == 2
    assert "input_output_alias" in computation_cache().values()[-1].executable.as_text()
    assert (t1.cpu().tolist(), t2.cpu().tolist(), t3.cpu().tolist()) == ([2.0] * 7, [3.0] * 7, [2.0] * 7)


def test_donation_enters_the_hash_only_when_there_are_donors():
    t = torch.ones(9).to(DEV)
    mark()
    u = t * 3  # t is not an output: no donor
    lazyxla.sync()
    assert "donation" not in [s.site for s in debug.last_fold().steps]
    assert last_compile_alias() == 0.0
    mark()
    t.mul_(3)  # t is an output of this execution: donated
    lazyxla.sync()
    sites = [s.site for s in debug.last_fold().steps]
    assert sites[-3:] == ["parameters", "donation", "sharding"]
    don = [s for s in debug.last_fold().steps if s.site == "donation"]
    assert len(don) == 1 and "donated parameters [" in don[0].summary
    assert last_compile_alias() == 1.0
    assert u.cpu().tolist() == [3.0] * 9 and t.cpu().tolist() == [3.0] * 9


def test_value_read_never_donates():
    t = torch.ones(11).to(DEV)
    mark()
    t.add_(1)
    assert t.cpu().tolist() == [2.0] * 11
    assert last_compile_alias() == 0.0
    assert t.cpu().tolist() == [2.0] * 11  # the buffer is still there for a second read


def test_optimizer_state_updates_in_place_and_references_follow():
    torch.manual_seed(0)
    m = torch.nn.Linear(6, 3).to(DEV)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    w = m.weight  # a Python reference held across steps
    x = torch.randn(4, 6).to(DEV)
    for _ in range(3):
        opt.zero_grad()
        m(x).sum().backward()
        opt.step()
        lazyxla.sync()
    fold = debug.last_fold()
    donated = [s for s in fold.steps if s.site == "donation"]
    assert donated, "weights and momentum buffers should be donated"
    assert torch.equal(w.cpu(), m.weight.cpu())


def test_user_marked_donation_counts_and_the_dead_buffer_raises_clearly():
    keep = torch.ones(13).to(DEV)
    gone = torch.ones(13).to(DEV)
    c0 = met.counter_value("XlaSetBufferDonation") or 0
    assert lazyxla.set_buffer_donation(gone, True)
    assert met.counter_value("XlaSetBufferDonation") == c0 + 1
    mark()
    out = keep + gone
    lazyxla.sync()
    assert last_compile_alias() == 1.0
    assert out.cpu().tolist() == [2.0] * 13
    with pytest.raises(RuntimeError, match="donated"):
        gone.cpu()
    pending = keep * 2
    assert not lazyxla.set_buffer_donation(pending, True)  # no buffer yet


def _run(code, env):
    import os
    e = dict(os.environ, **env)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@in_a_child("the variable")
def test_param_aliasing_env_off_disables_donation():
    code = """
        import torch, lazyxla, lazyxla.debug as d, lazyxla.debug.metrics as met
        t = torch.ones(3).to(lazyxla.device())
        t.add_(1)
        lazyxla.sync()
        print(met.metric_data('InputOutputAliasCount')[1], 'donation' in [s.site for s in d.last_fold().steps])
    """
    assert _run(code, {"XLA_ENABLE_PARAM_ALIASING": "0"}) == "0.0 False"
    assert _run(code, {"XLA_ENABLE_PARAM_ALIASING": "1"}) == "1.0 True"


def test_each_donated_buffer_is_given_to_the_tensor_that_replaces_it():
    """JAX pairs a donated input with the first output of its shape not yet paired: the program's
    outputs are ordered so that this is the tensor the input's buffer held (paired with another
    tensor's, XLA copies the parameter in and the result out)."""
    from lazyxla import events

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(6)]).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(8, 32).to(DEV)
    seen = []

    def check(prog, graph, outs):
        import re
        head = prog.executable.as_text().split("\n")[0]
        pairs = [(int(k), int(i)) for k, i in re.findall(r"\{(\d+)\}: \((\d+), \{\}", head)]
        seen.append([graph.params[i].owner().ir == graph.roots[k] for k, i in pairs])

    events.AFTER_RUN.append(check)
    try:
        for _ in range(3):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            lazyxla.sync()
    finally:
        events.AFTER_RUN.remove(check)
    assert len(seen[-1]) == 24 and all(seen[-1]), seen[-1]  # 6 weights, 6 biases, 12 momentum buffers


@pytest.mark.parametrize("replayed", [False, True], ids=["sync", "replay"])
def test_a_training_loop_holds_one_set_of_each_state_on_the_device(replayed):
    """After each AdamW step the device holds the parameters, the two moments and the gradients:
    four sets, never a fifth (the last synced step's outputs, the gradients included, were held
    by the thread that waits on programs until the next program came; a replay loop runs none)."""
    import gc

    import jax
    gc.collect()
    # what earlier tests of this process still hold (a module's own tensors) is not this loop's:
    # held here, so no new array can take one's place and id
    before = jax.live_arrays()
    old = {id(a) for a in before}
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256)).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=replayed)
    x = torch.randn(4, 256).to(DEV)
    params = sum(p.numel() * 4 for p in model.parameters())

    def step():
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    run = lazyxla.compile(step, replay=True) if replayed else None
    held = []
    for _ in range(4):
        if run is not None:
            run()
        else:
            step()
            lazyxla.sync()
        lazyxla.wait_device_ops()
        gc.collect()
        held.append(sum(a.nbytes for a in jax.live_arrays() if a.size >= 256 and id(a) not in old) / params)
    assert max(held[1:]) == pytest.approx(4.0, abs=0.05), held
