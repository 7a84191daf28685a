"""XLA options chosen by what a program holds (``compiler.OPTION_RULES``): on XLA:CPU a
convolution network's program and every small program compile with the loop emitters, every
program without a loop at LLVM's O1, and a user's ``XLA_FLAGS`` setting the option wins. Values
are eager's either way."""
import os
import subprocess
import sys
import textwrap

import jax
import pytest
import torch
from torch import nn

import lazyxla

DEV = lazyxla.device()
pytestmark = pytest.mark.usefixtures("nothing_pending")
O1 = {"xla_backend_optimization_level": 1}
OFF = dict(O1, xla_cpu_use_fusion_emitters=False)


@pytest.fixture
def passed(monkeypatch):
    """The options each XLA compile of the test was given."""
    seen = []
    compile_ = jax.stages.Lowered.compile

    def spy(self, compiler_options=None, **kw):
        seen.append(dict(compiler_options or {}))
        return compile_(self, compiler_options, **kw)
    monkeypatch.setattr(jax.stages.Lowered, "compile", spy)
    return seen


def _step(model, x, dev):
    """A forward and backward: one program on the lazy device."""
    torch.manual_seed(0)
    m = model().to(dev)
    loss = m(x.to(dev)).square().mean()
    loss.backward()
    if dev == DEV:
        lazyxla.sync()
    return loss.item(), [p.grad.cpu() for p in m.parameters()]


def _convnet():
    return nn.Sequential(nn.Conv2d(3, 5, 3, padding=1), nn.BatchNorm2d(5), nn.ReLU(), nn.Conv2d(5, 2, 1))


def _mlp():
    return nn.Sequential(nn.Linear(7, 9), nn.ReLU(), nn.Linear(9, 2))


def _deep_mlp():
    return nn.Sequential(*[m for _ in range(24) for m in (nn.Linear(9, 9), nn.Tanh())], nn.Linear(9, 2))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the rules are XLA:CPU's")
def test_convolutions_and_small_programs_compile_with_the_loop_emitters_and_every_program_at_o1(passed):
    x = torch.randn(2, 3, 6, 7)
    got, want = _step(_convnet, x, DEV), _step(_convnet, x, "cpu")
    assert passed and all(o == OFF for o in passed)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    passed.clear()
    x = torch.randn(4, 9)
    got, want = _step(_mlp, x[:, :7], DEV), _step(_mlp, x[:, :7], "cpu")   # a step of ~30 op nodes
    assert len(passed) == 1 and passed[0] == OFF, passed
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    passed.clear()
    got, want = _step(_deep_mlp, x, DEV), _step(_deep_mlp, x, "cpu")      # over 200 op nodes
    assert len(passed) == 1 and passed[0] == O1, passed
    assert lazyxla.metrics.metric_data("TensorsGraphSize")[2][-1][1] > 200
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_rules_by_what_a_program_holds_and_its_size():
    """The table read for a program of the rules' edges (the platform this process's)."""
    from lazyxla.compiler.compile import options_for
    conv, big, small = {"aten::convolution", "aten::add"}, 201, 200
    if jax.default_backend() != "cpu":
        assert options_for(conv, False, small) == {}
        return
    assert options_for({"aten::add"}, False, big) == O1
    assert options_for({"aten::add"}, False, small) == OFF
    assert options_for({"aten::add"}, True, small) == {"xla_cpu_use_fusion_emitters": False}
    assert options_for({"aten::add"}, True, big) == {}
    assert options_for(conv, True, big) == {"xla_cpu_use_fusion_emitters": False}
    assert options_for(conv, False, big) == OFF


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the rule is XLA:CPU's")
def test_a_program_with_a_loop_keeps_xlas_default_level(passed):
    """A loop's body kernels unroll whole at O1 and compile slower than at XLA's default: a
    program holding a loop (``lazyxla.scan`` here; a rolled one alike) is left at the default."""
    w = torch.randn(8, 8) * 0.3
    xs = torch.randn(6, 4, 8)

    def cell(c, x):
        c = torch.tanh(c @ w.to(c.device) + x)
        return c, c.sum(-1)
    c, ys = lazyxla.scan(cell, torch.zeros(4, 8).to(DEV), xs.to(DEV))
    got = (c.cpu(), ys.cpu())
    assert passed and all("xla_backend_optimization_level" not in o for o in passed)
    want_c, want_ys = torch.zeros(4, 8), []
    for x in xs:
        want_c, y = cell(want_c, x)
        want_ys.append(y)
    torch.testing.assert_close(got, (want_c, torch.stack(want_ys)), rtol=1e-5, atol=1e-5)


def test_the_users_xla_flags_win():
    """XLA reads ``XLA_FLAGS`` when it starts; a flag there that sets the option is left alone."""
    code = textwrap.dedent("""
        import jax, torch, lazyxla
        seen = []
        compile_ = jax.stages.Lowered.compile
        def spy(self, compiler_options=None, **kw):
            seen.append(dict(compiler_options or {}))
            return compile_(self, compiler_options, **kw)
        jax.stages.Lowered.compile = spy
        m = torch.nn.Conv2d(3, 2, 3).to(lazyxla.device())
        m(torch.randn(1, 3, 5, 5).to(lazyxla.device())).sum().item()
        print("options", seen)
    """)
    env = dict(os.environ, XLA_FLAGS="--xla_cpu_use_fusion_emitters=true --xla_backend_optimization_level=2")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    assert "options [{}]" in p.stdout, p.stdout


def test_the_heap_is_trimmed_before_the_first_run_on_the_cpu_and_not_elsewhere(monkeypatch):
    """After a compile the heap XLA freed goes back to the system (``malloc_trim``) on XLA:CPU,
    before the program runs (its buffers are that heap's); on an accelerator, whose buffers are
    its own, not at all (1.37 s of GPT-2 124M's first step on a v5e's host, and on a thread of
    its own it stalled the next steps' allocations)."""
    import types
    from lazyxla.compiler import compile as comp
    ran = []
    monkeypatch.setattr(comp, "_TRIM", lambda pad: ran.append(pad))
    x = torch.randn(3, 5)
    torch.testing.assert_close(torch.atan2(x.to(DEV), x.to(DEV) + 3).cpu(), torch.atan2(x, x + 3))
    assert ran == [0]
    monkeypatch.setattr(comp, "jax_device", lambda: types.SimpleNamespace(platform="tpu"))  # the rule's view only
    torch.testing.assert_close(torch.hypot(x.to(DEV), x.to(DEV) - 3).cpu(), torch.hypot(x, x - 3))
    assert ran == [0]
