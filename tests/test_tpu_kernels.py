"""Pallas kernels for the TPU (``lazyxla.lowering.tpu_kernels``), run here by Pallas' interpreter
(``LAZYXLA_TPU_KERNELS=interpret``, in a process of its own: the mode is read once): attention
whose call fits the splash attention kernel's rules is computed by it, forward and backward,
with eager's values and gradients; a call that does not fit keeps the XLA lowering, and the mode
is part of the compile environment (the key) only when kernels replace lowerings."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json, sys, torch, torch.nn.functional as F, lazyxla
    d = lazyxla.device()
    out = {}
    for name, shape_q, shape_kv, kw in (("causal", (1, 2, 256, 64), (1, 2, 256, 64), dict(is_causal=True)),
                                        ("plain", (1, 2, 128, 64), (1, 2, 256, 64), {}),
                                        ("gqa", (1, 4, 128, 64), (1, 2, 128, 64), dict(is_causal=True, enable_gqa=True)),
                                        ("short", (1, 2, 100, 64), (1, 2, 100, 64), dict(is_causal=True))):
        for dt in (torch.float32, torch.bfloat16):
            g = torch.Generator().manual_seed(0)
            q = torch.randn(*shape_q, generator=g).to(dt)
            k, v = (torch.randn(*shape_kv, generator=g).to(dt) for _ in range(2))
            res = {}
            for dev in ("cpu", d):
                ins = [t.detach().clone().to(dev).requires_grad_() for t in (q, k, v)]
                o = F.scaled_dot_product_attention(*ins, **kw)
                (o.float() * torch.linspace(-1, 1, 64).to(dev)).square().sum().backward()
                if dev != "cpu":
                    text = lazyxla.dump_hlo([o]) + lazyxla.dump_hlo([ins[0].grad])
                    lazyxla.sync()
                res[str(dev)] = [t.detach().float().cpu() for t in [o] + [t.grad for t in ins]]
            err = max(float(((a - b).abs() / (b.abs() + 1)).max()) for a, b in zip(res["cpu"], res[str(d)]))
            out[f"{name}-{str(dt)[6:]}"] = {"err": err, "loops": text.count(" while(")}
    x = torch.ones(2, 8).to(d)
    out["key"] = lazyxla.graph_hash([x * 3])
    print(json.dumps(out))
""")


def _start(mode):
    env = dict(os.environ, LAZYXLA_TPU_KERNELS=mode, JAX_PLATFORMS="cpu")
    return subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(p):
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs():
    started = {mode: _start(mode) for mode in ("interpret", "off")}  # side by side: one core each
    return {mode: _result(p) for mode, p in started.items()}


def test_fitting_calls_run_the_kernel_with_eagers_values_and_gradients(runs):
    got, off = runs["interpret"], runs["off"]
    for case in ("causal", "plain", "gqa"):
        for dt, tol in (("float32", 2e-4), ("bfloat16", 4e-2)):
            r = got[f"{case}-{dt}"]
            assert r["err"] < tol, (case, dt, r)
            assert r["loops"] > off[f"{case}-{dt}"]["loops"], (case, dt)  # the kernel's grid, interpreted


def test_a_call_that_does_not_fit_keeps_the_xla_lowering(runs):
    for dt, tol in (("float32", 2e-4), ("bfloat16", 4e-2)):  # 100 is no multiple of the kernel's block
        got, off = runs["interpret"][f"short-{dt}"], runs["off"][f"short-{dt}"]
        assert got["loops"] == off["loops"] and got["err"] < tol, (dt, got, off)


def test_the_mode_is_part_of_the_key_only_when_kernels_replace_lowerings(runs):
    """``interpret`` changes programs: its own key. ``on``, the default, changes programs only on
    a TPU: on a CPU its programs, and their keys, are ``off``'s."""
    assert runs["interpret"]["key"] != runs["off"]["key"]
    env = dict(os.environ, LAZYXLA_TPU_KERNELS="on", JAX_PLATFORMS="cpu")
    code = ("import lazyxla, torch; from lazyxla.xla.client import tpu_kernels_mode; "
            "x = torch.ones(2, 8).to(lazyxla.device()); print(tpu_kernels_mode(), lazyxla.graph_hash([x * 3]))")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    mode, key = r.stdout.split()[-2:]
    assert mode == "off" and key == runs["off"]["key"]


def test_an_unknown_mode_is_refused_naming_the_variable():
    env = dict(os.environ, LAZYXLA_TPU_KERNELS="fast", JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", "import lazyxla"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "LAZYXLA_TPU_KERNELS='fast': one of off, on, interpret" in r.stderr
