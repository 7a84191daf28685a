"""The end-to-end demo (lazyxla/tools/demo.py) and its command line (``python -m lazyxla demo``).

In process: two epochs learn the digits, the second epoch compiles nothing new, and the fold
page holds the run's keys (not the process's earlier ones). As a
subprocess: the CLI exits 0 and prints the accuracy and the compile summary.
"""
from __future__ import annotations

import os
import subprocess
import sys

from lazyxla.tools import demo


def test_demo_learns_and_stops_compiling(monkeypatch):
    import torch
    import lazyxla
    from lazyxla.debug import explain
    d = lazyxla.device()   # compiles of this process before the demo
    for t in (torch.arange(7.0).to(d) * 13, torch.ones(3, 5).to(d).sum(0), torch.linspace(0, 1, 9).to(d).exp()):
        t.cpu()
    before = {k["hash"] for k in explain.export()["keys"]}
    written = []
    write = demo.fold_page.write
    monkeypatch.setattr(demo.fold_page, "write", lambda path, data: (written.append(data), write(path, data))[1])
    r = demo.run(epochs=2, quiet=True)
    assert r["test_accuracy"] > 0.8, r
    assert r["compiles_after_first_epoch"] == 0, r
    assert len(r["epoch_losses"]) == 2
    assert r["epoch_losses"][1] < r["epoch_losses"][0], r
    assert os.path.getsize(r["fold_page"]) > 0, r  # it ends by writing its fold page: its run's keys,
    (data,) = written                                # and an earlier key only where a record compares with it
    run = {k["hash"] for k in explain.export()["keys"]} - before
    on_page, compared = {k["hash"] for k in data["keys"]}, {x["closest"] for x in data["records"]}
    assert run and {x["hash"] for x in data["records"]} == run <= on_page, data["records"]
    assert not (on_page & before) - compared, (on_page & before, compared)


def test_cli_demo_subprocess():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.run([sys.executable, "-m", "lazyxla", "demo", "--epochs", "1", "--quiet"],
                       capture_output=True, text=True, timeout=300, env=env)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "test accuracy" in out, out
    assert "UncachedCompile" in out, out
    assert "fold page: " in out, out
