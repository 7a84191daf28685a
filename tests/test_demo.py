"""The end-to-end demo (lazyxla/tools/demo.py) and its command line (``python -m lazyxla demo``).

In process: two epochs learn the digits and the second epoch compiles nothing new. As a
subprocess: the CLI exits 0 and prints the accuracy and the compile summary.
"""
from __future__ import annotations

import os
import subprocess
import sys

from lazyxla.tools import demo


def test_demo_learns_and_stops_compiling():
    r = demo.run(epochs=2, quiet=True)
    assert r["test_accuracy"] > 0.8, r
    assert r["compiles_after_first_epoch"] == 0, r
    assert len(r["epoch_losses"]) == 2
    assert r["epoch_losses"][1] < r["epoch_losses"][0], r
    assert os.path.getsize(r["fold_page"]) > 0, r  # it ends by writing its fold page


def test_cli_demo_subprocess():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.run([sys.executable, "-m", "lazyxla", "demo", "--epochs", "1", "--quiet"],
                       capture_output=True, text=True, timeout=300, env=env)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "test accuracy" in out, out
    assert "UncachedCompile" in out, out
    assert "fold page: " in out, out
