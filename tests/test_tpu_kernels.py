"""Pallas kernels for the TPU (``lazyxla.lowering.tpu_kernels``): attention whose call fits the
splash attention kernel's rules is computed by it, forward and backward, with eager's values and
gradients; a call that does not fit keeps the XLA lowering, and the mode is part of the compile
environment (the key) only when kernels replace lowerings.

On XLA:CPU the kernels run in Pallas' interpreter (``LAZYXLA_TPU_KERNELS=interpret``, in a
process of its own: the mode is read once), beside a process with them ``off``. On a TPU the same
script runs in this process, with the kernels compiled for the chip (``on``, the default): the
programs hold them as TPU custom calls."""
import contextlib
import io
import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import ON_CPU

SCRIPT = textwrap.dedent("""
    import json, os, sys, torch, torch.nn.functional as F, lazyxla
    from lazyxla.lowering import tpu_kernels
    d = lazyxla.device()
    tpu_kernels._splash_kernel.cache_clear()
    only = os.environ.get("KERNEL_CASES")  # names like causal-bfloat16 (unset: every case)
    out = {}
    for name, shape_q, shape_kv, kw in (("causal", (1, 2, 256, 64), (1, 2, 256, 64), dict(is_causal=True)),
                                        ("plain", (1, 2, 128, 64), (1, 2, 256, 64), {}),
                                        ("gqa", (1, 4, 128, 64), (1, 2, 128, 64), dict(is_causal=True, enable_gqa=True)),
                                        ("short", (1, 2, 100, 64), (1, 2, 100, 64), dict(is_causal=True))):
        for dt in (torch.float32, torch.bfloat16):
            if only is not None and f"{name}-{str(dt)[6:]}" not in only.split(","):
                continue
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
            out[f"{name}-{str(dt)[6:]}"] = {"err": err, "loops": text.count(" while("),
                                             "kernels": text.count("tpu_custom_call")}
    x = torch.ones(2, 8).to(d)
    out["key"] = lazyxla.graph_hash([x * 3])
    made = tpu_kernels._splash_kernel.cache_info()
    out["made"] = [made.misses, made.hits]
    print(json.dumps(out))
""")


# On XLA:CPU each case the kernel fits is interpreted (5-6 s each, forward and backward): each
# of the three shapes it fits runs once, the dtypes alternating; the one it does not fit (short)
# in both. On a TPU every case runs.
CPU_CASES = "causal-bfloat16,plain-float32,gqa-bfloat16,short-float32,short-bfloat16"


def _start(mode):
    env = dict(os.environ, LAZYXLA_TPU_KERNELS=mode, JAX_PLATFORMS="cpu", KERNEL_CASES=CPU_CASES)
    return subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(p):
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _here():
    """The script in this process (on a TPU: its kernels are the chip's)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(SCRIPT, {"__name__": "tpu_kernels_script"})  # noqa: S102 (the test's own script)
    return json.loads(printed.getvalue().strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs():
    if not ON_CPU:
        return {"on": _here()}
    started = {mode: _start(mode) for mode in ("interpret", "off")}  # side by side: one core each
    return {mode: _result(p) for mode, p in started.items()}


def test_fitting_calls_run_the_kernel_with_eagers_values_and_gradients(runs):
    ran = runs["interpret" if ON_CPU else "on"]
    assert {k.split("-")[0] for k in ran} >= {"causal", "plain", "gqa"}
    assert {k.split("-")[1] for k in ran if "-" in k} == {"float32", "bfloat16"}
    for case in ("causal", "plain", "gqa"):
        for dt, tol in (("float32", 2e-4), ("bfloat16", 4e-2)):
            if f"{case}-{dt}" not in ran:
                continue
            if ON_CPU:
                r, off = runs["interpret"][f"{case}-{dt}"], runs["off"][f"{case}-{dt}"]
                assert r["loops"] > off["loops"], (case, dt)  # the kernel's grid, interpreted
            else:  # the chip's kernels, forward and backward; float32 only at 'default' (RULES)
                from lazyxla import backends
                r = runs["on"][f"{case}-{dt}"]
                fits = dt == "bfloat16" or backends.get_mat_mul_precision() == "default"
                assert (r["kernels"] > 0) == fits, (case, dt, r)
            assert r["err"] < tol, (case, dt, r)


def test_a_kernel_is_made_once_per_shape(runs):
    """The splash kernel's masks (their block tables) are made once per heads, lengths and
    causality, however many layers and programs call it: three shapes fit here, each called by
    its forward and backward (on a TPU in two dtypes), each first checked alone and then traced
    in its program. With the kernels off none is made."""
    mode = "interpret" if ON_CPU else "on"
    misses, hits = runs[mode]["made"]
    assert misses == 3 and hits >= 3, runs[mode]["made"]
    if ON_CPU:
        assert runs["off"]["made"] == [0, 0]


def test_a_call_that_does_not_fit_keeps_the_xla_lowering(runs):
    for dt, tol in (("float32", 2e-4), ("bfloat16", 4e-2)):  # 100 is no multiple of the kernel's block
        if ON_CPU:
            got, off = runs["interpret"][f"short-{dt}"], runs["off"][f"short-{dt}"]
            assert got["loops"] == off["loops"], (dt, got, off)
        else:
            got = runs["on"][f"short-{dt}"]
            assert got["kernels"] == 0, (dt, got)
        assert got["err"] < tol, (dt, got)


@pytest.mark.cpu_only("compares the keys of two processes on XLA:CPU, the interpreter's and the kernels' off; "
                      "the rule is host code")
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


@pytest.mark.cpu_only("reads the variable in a process on XLA:CPU: host code")
def test_an_unknown_mode_is_refused_naming_the_variable():
    env = dict(os.environ, LAZYXLA_TPU_KERNELS="fast", JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", "import lazyxla"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "LAZYXLA_TPU_KERNELS='fast': one of off, on, interpret" in r.stderr


def test_the_kernels_products_stay_one_bfloat16_pass_at_any_setting():
    """A program is traced at the matmul precision's setting (``xla.precision.scope``); the
    kernels, which run only where one bfloat16 pass is the products' precision, keep it: at
    ``'highest'`` their products asked Mosaic for float32 contraction, which a v5e refused for
    bfloat16 attention. Checked in the traced kernels (no lowering needed)."""
    import jax
    import jax.numpy as jnp
    from lazyxla.lowering import tpu_kernels
    from lazyxla.xla import precision
    q = jnp.ones((1, 2, 128, 64), jnp.bfloat16)
    was = precision.get_mat_mul_precision()
    try:
        precision.set_mat_mul_precision("highest")
        with precision.scope():
            text = str(jax.make_jaxpr(lambda a, b, c: tpu_kernels.attention_backward(a, a, b, c, True, 0.125))(q, q, q))
            outside = str(jax.make_jaxpr(lambda a, b: jnp.einsum("qd,kd->qk", a, b))(q[0, 0], q[0, 0]))
    finally:
        precision.set_mat_mul_precision(was)
    assert text.count("pallas_call") >= 2 and "dot_general" in text
    assert "HIGHEST" not in text
    assert "HIGHEST" in outside  # the setting still reaches the program's own products
