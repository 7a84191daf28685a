"""Matmul precision (``lazyxla.backends.set_mat_mul_precision``, torch_xla's
``torch_xla.backends``): ``'default'`` unless set, part of every program's key, and followed by
every product but those inside algorithms and weight matrices (``lazyxla.xla.precision.RULES``).
On the CPU, XLA computes float32 at every setting: the values stay eager's, and what the setting
changes is the program text and its key (the TPU's speed and values are measured by
``bench/tpu.py`` on the chip)."""
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import lazyxla
import lazyxla.debug.metrics as met
from lazyxla import backends
from lazyxla.xla import precision
from lazyhelp import in_a_child

DEV = lazyxla.device()


@pytest.fixture(autouse=True)
def setting_restored():
    lazyxla.sync()
    was = backends.get_mat_mul_precision()  # the session's: 'highest' on an accelerator (conftest)
    yield
    backends.set_mat_mul_precision(was)


@in_a_child("the setting's default and names")
def test_default_is_torch_xlas_and_a_bad_name_is_refused():
    code = "import lazyxla; print(lazyxla.backends.get_mat_mul_precision())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-1] == "default"  # a fresh process's
    for p in ("high", "highest", "default"):
        backends.set_mat_mul_precision(p)
        assert backends.get_mat_mul_precision() == p
    with pytest.raises(ValueError, match="'medium' is not one of default, high, highest"):
        backends.set_mat_mul_precision("medium")
    assert backends.get_mat_mul_precision() == "default"  # the last one set


def test_the_users_products_follow_the_setting_and_algorithms_keep_highest():
    a = torch.randn(8, 8).to(DEV)
    w = torch.randn(4, 3, 3, 3).to(DEV)
    x = torch.randn(1, 3, 8, 8).to(DEV)
    texts = {}
    for p in ("default", "high", "highest"):
        backends.set_mat_mul_precision(p)
        texts[p] = (lazyxla.dump_hlo([a @ a]), lazyxla.dump_hlo([F.conv2d(x, w)]),
                    lazyxla.dump_hlo([F.adaptive_avg_pool2d(x, (3, 5))]))
    assert "operand_precision" not in texts["default"][0]  # XLA's DEFAULT: no attribute
    assert "operand_precision={high,high}" in texts["high"][0]
    assert "operand_precision={highest,highest}" in texts["highest"][0]
    assert "operand_precision" not in texts["default"][1] and "operand_precision={highest,highest}" in texts["highest"][1]
    for p in texts:  # adaptive average pooling's window matrices: highest at every setting
        assert "operand_precision={highest,highest}" in texts[p][2], p


def test_the_setting_is_part_of_the_key_and_the_explanation_names_it():
    a = torch.randn(6, 6).to(DEV)
    keys = {}
    for p in ("default", "highest"):
        backends.set_mat_mul_precision(p)
        keys[p] = lazyxla.graph_hash([a @ a + 1])
    assert keys["default"] != keys["highest"]
    before = met.counter_value("UncachedCompile") or 0
    for p in ("default", "highest", "default", "highest"):
        backends.set_mat_mul_precision(p)
        b = a @ a + 2
        lazyxla.sync()
    assert (met.counter_value("UncachedCompile") or 0) - before == 2  # one program per setting, each found again
    backends.set_mat_mul_precision("high")
    b = a @ a + 2
    lazyxla.sync()
    log = lazyxla.debug.recompile_log()[-1]
    assert log.site == "environment", log.text
    env = [s for s in lazyxla.debug.last_fold().steps if s.site == "environment"][0]
    assert "mat_mul_precision=high" in env.summary
    del b


@pytest.mark.cpu_only("XLA:CPU computes float32 products at every setting; a TPU's 'default' is one "
                      "bfloat16 pass")
def test_values_are_eagers_at_every_setting_on_the_cpu():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    want = m(x)
    lm = m.to(DEV)
    for p in ("default", "high", "highest"):
        backends.set_mat_mul_precision(p)
        torch.testing.assert_close(lm(x.to(DEV)).cpu(), want, rtol=1e-5, atol=1e-6)


def test_rules_name_every_family_the_lowerings_ask_for():
    import lazyxla.lowering as lowering
    root = os.path.dirname(lowering.__file__)
    asked = set()
    for f in os.listdir(root):
        if f.endswith(".py"):
            asked |= set(re.findall(r'precision\.of\("(\w+)"\)', open(os.path.join(root, f)).read()))
    assert asked and asked <= set(precision.RULES), asked - set(precision.RULES)
    assert {f for f, (rule, _) in precision.RULES.items() if rule == "setting"} >= {"matmul", "conv"}


@in_a_child("torch_xla's names under lazyxla run")
def test_torch_xla_backends_under_lazyxla_run(tmp_path):
    script = tmp_path / "prec.py"
    script.write_text(textwrap.dedent("""
        import torch, torch_xla, torch_xla.backends
        torch_xla.backends.set_mat_mul_precision("highest")
        a = torch.ones(3, 3).to(torch_xla.device())
        print(torch_xla.backends.get_mat_mul_precision(), (a @ a).sum().item())
    """))
    r = subprocess.run([sys.executable, "-m", "lazyxla", "run", str(script)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-2:] == ["highest", "27.0"]
