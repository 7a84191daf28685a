"""``lazyxla explain --walk``: one sync of a user's run walked through lazyxla's executor.

A training script (SGD with momentum, dropout, a print of a pending loss) is walked: the page
has the eight stages in the seed's order, each with lazyxla's own source at the line that does
the work (checked against the installed files), and the values that sync had: the cache's
counts, the live tensors with the script's lines, the seed before and after and its chain, the
fold whose last digest is the key, hit or compile with the two counters, the donated parameters
and why, the program text, the buffers that came back. ``--sync N`` and ``--sync HASH`` pick
another lookup; a value read says why nothing was donated. A compile that raised, a run
without a sync and bad arguments are said plainly, with ``lazyxla explain``'s exit codes.
Headless Chromium steps through the stages with the buttons and the keyboard.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from lazyxla import cli
from lazyxla.debug import walk

STAGES = ["cache", "arena", "rng", "hash", "lookup", "donation", "lowering", "execute"]

TRAIN = textwrap.dedent("""\
    import sys
    import torch
    import lazyxla
    dev = lazyxla.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.25),
                                torch.nn.Linear(16, 2)).to(dev)  # MODEL
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.1)  # 1st step: the steady program
    for step in range(3):
        x = torch.randn(4, 8).to(dev)  # BATCH
        loss = model(x).pow(2).mean()  # LOSS
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step == 2:
            print("loss", loss)  # READ
        lazyxla.sync()  # SYNC
    print("args", sys.argv[1:])
""")


def _line(marker, text=TRAIN):
    return next(i for i, line in enumerate(text.splitlines(), 1) if marker in line)


def _embedded(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="walk-data">(.*?)</script>', page, re.S)
    assert m, "no embedded data"
    return json.loads(m.group(1))


def _read(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return text, _embedded(text)


def _stage(data, name):
    return next(s for s in data["stages"] if s["name"] == name)


def _facts(stage):
    return {k: v for k, v in stage["facts"]}


def _table(stage, caption_part):
    return next(t for t in stage["tables"] if caption_part in t["caption"])


@pytest.fixture(scope="module")
def run_dir():
    d = tempfile.mkdtemp(prefix="lazyxla-walk-test-")
    with open(os.path.join(d, "train.py"), "w") as f:
        f.write(TRAIN)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def walked(run_dir):
    """``lazyxla explain --walk train.py one -o walk.html`` in a new process, once."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.run([sys.executable, "-m", "lazyxla", "explain", "--walk", "train.py", "one", "-o", "walk.html"],
                       cwd=run_dir, capture_output=True, text=True, timeout=300, env=env)
    return p, os.path.join(run_dir, "walk.html")


# ---------------------------------------------------------------------------------------
def test_every_stage_names_its_function_and_working_line():
    """The walk follows the code: each stage's function exists, and its marked line is the line
    of the installed file that does the work. This fails when a function moves or its working
    line changes without ``walk.STAGES`` following."""
    assert [s.name for s in walk.STAGES] == STAGES
    root = os.path.dirname(os.path.dirname(os.path.abspath(walk.__file__)))
    root = os.path.dirname(root)
    for stage in walk.STAGES:
        src = walk.stage_source(stage)
        assert src["file"].startswith("lazyxla/") and src["file"].endswith(".py")
        assert src["file"] == stage.module.replace(".", "/") + ".py"
        with open(os.path.join(root, src["file"]), encoding="utf-8") as f:
            lines = f.read().splitlines()
        assert stage.marks in lines[src["mark"] - 1], (stage.name, lines[src["mark"] - 1])
        assert lines[src["start"] - 1].lstrip().startswith("def " + stage.function.split(".")[-1])
        assert src["source"] == f"{src['file']}:{src['mark']}"
    moved = walk.Stage("lookup", "t", "lazyxla.engine.executor", "lookup", "a line that is not there", "w")
    with pytest.raises(walk.WalkSourceError, match="lazyxla.engine.executor.lookup has no line"):
        walk.stage_source(moved)
    gone = walk.Stage("lookup", "t", "lazyxla.engine.executor", "no_such_function", "x", "w")
    with pytest.raises(walk.WalkSourceError, match="no_such_function"):
        walk.stage_source(gone)


def test_walk_of_a_training_run(walked):
    p, page = walked
    assert p.returncode == 0, p.stdout + p.stderr
    assert "args ['one']" in p.stdout
    assert os.path.abspath(page) in p.stderr and "lookup 4 of 4" in p.stderr
    text, data = _read(page)
    assert "http://" not in text and "https://" not in text and "<link" not in text
    assert not re.search(r"""\s(src|href)\s*=\s*["']?(?!#)""", text), "external reference"
    # the run: a compiling sync (the optimizer's first step is the steady one), a sync found in
    # the cache, a read of the pending loss, then a sync found in the cache
    assert [(r["cause"], r["outcome"]) for r in data["lookups"]] == [
        ("sync", "compile"), ("sync", "hit"), ("read", "compile"), ("sync", "hit")]
    assert data["lookups"][0]["hash"] == data["lookups"][1]["hash"] == data["lookups"][3]["hash"]
    assert {r["where"] for r in data["lookups"]} >= {f"train.py:{_line('# SYNC')}", f"train.py:{_line('# READ')}"}
    assert data["walked"] == 4
    key = data["lookups"][3]["hash"]

    # sections in the seed's order, each with the source it shows
    sections = re.findall(r'<section class="stage pending" id="stage-(\w+)" data-stage="(\w+)" '
                          r'data-source="([^"]+)"', text)
    assert [s[1] for s in sections] == STAGES
    for (_, name, source), st in zip(sections, data["stages"]):
        assert source == st["source"]["source"] == walk.stage_source(walk.STAGES[STAGES.index(name)])["source"]
    assert text.count('class="src-line mark"') == 8

    cache = _facts(_stage(data, "cache"))
    assert cache["XLA_COMPILATION_CACHE_SIZE"] == "2048 (default)"
    assert cache["hits so far (CachedCompile)"] == 2 and cache["misses so far (UncachedCompile)"] == 2
    assert cache["evictions so far"] == 0 and cache["entries"] == "2 of 2048"
    assert "unset" in cache["XLA_PERSISTENT_CACHE_PATH"]

    arena = _stage(data, "arena")
    rows = _table(arena, "live tensors")["rows"]
    by_line = {}
    for r in rows:
        by_line.setdefault(r[4], []).append(r)
    batch = by_line[f"train.py:{_line('# BATCH')}"]
    assert any(r[1] == "[4, 8]" and r[3] == "device data" and r[5] == "no" and "parameter" in r[6] for r in batch)
    assert any(r[1] == "[16, 8]" and r[5] == "yes" for r in by_line[f"train.py:{_line('# MODEL')}"])
    assert any(r[1] == "[]" and r[3] == "pending IR" and r[5] == "yes" for r in by_line[f"train.py:{_line('# LOSS')}"])

    rng = _stage(data, "rng")
    f = _facts(rng)
    before, after = f["host seed before"], f["host seed after"]
    assert after == (1012031 + before * 7012063) % (1 << 64)
    assert f["random ops in this graph"] == 1  # the dropout's mask
    assert len(_table(rng, "seed chain")["rows"]) == 1

    h = _stage(data, "hash")
    sites = [s["site"] for s in h["steps"]]
    assert sites[0] == "force_ltc_data" and sites[1] == "environment" and sites[-1] == "sharding"
    assert "donation" in sites and "parameters" in sites
    assert h["steps"][-1]["digest"] == key and h["steps"][0]["summary"] == "force_ltc_data=true"

    lk = _facts(_stage(data, "lookup"))
    assert lk["outcome"].startswith("hit")
    assert (lk["CachedCompile before"], lk["CachedCompile after"]) == (1, 2)
    assert lk["UncachedCompile before"] == lk["UncachedCompile after"] == 2
    assert any("Compiled at lookup 1 " in t for t in _stage(data, "lookup")["text"])

    don = _stage(data, "donation")
    prow = _table(don, "parameters")["rows"]
    donated = [r for r in prow if r[4] == "yes"]
    assert len(donated) == _facts(don)["donated parameters"] >= 8  # 4 weights, 4 momentum buffers
    assert all("written by this program" in r[5] for r in donated)
    assert any(r[1] == "[4, 8]" and r[4] == "no" and "only reads" in r[5] for r in prow)  # the batch
    ce = don["counterexample"]
    assert ce["second read, A kept"] == ce["first read"] != ce["second read, A donated"]
    assert abs(ce["second read, A donated"][0] - (ce["A"][0] + 0.8)) < 1e-6

    low = _stage(data, "lowering")
    lf = _facts(low)
    assert lf["parameter wrapping"].startswith("no: ") and lf["XLA_PARAMETER_WRAPPING_THREADSHOLD"] == 3200
    assert lf["sharding annotations"] == "none"
    assert "HloModule" in low["code"]["text"] or "module" in low["code"]["text"]
    assert "<details" in text

    ex = _stage(data, "execute")
    outs = _table(ex, "buffers")["rows"]
    assert len(outs) == len([s for s in h["steps"] if s["site"] == "tensors"])
    assert sum("donated buffer" in r[5] for r in outs) == len(donated)
    assert _facts(ex)["execute time (ExecuteTime)"].endswith(" ms")


def test_walk_picks_a_read_or_a_hash(run_dir, capsys):
    page = os.path.join(run_dir, "read.html")
    assert cli.main(["explain", "--walk", "--sync", "3", "-o", page, os.path.join(run_dir, "train.py")]) == 0
    _, data = _read(page)
    assert data["walked"] == 3 and data["lookups"][2]["cause"] == "read"
    h = _stage(data, "hash")
    assert h["steps"][0]["summary"] == "force_ltc_data=false"
    assert [s for s in h["steps"] if s["site"] == "tensors"] and "donation" not in [s["site"] for s in h["steps"]]
    don = _stage(data, "donation")
    assert _facts(don)["donated parameters"] == 0
    assert any("value read" in t and "donates nothing" in t for t in don["text"])
    rows = _table(_stage(data, "arena"), "live tensors")["rows"]
    read = [r for r in rows if r[6].startswith("read:")]
    assert len(read) == 1 and read[0][1] == "[]"  # only the loss is read
    assert any("not read" in r[6] for r in rows)  # the parameters' updates stay pending
    assert "unchanged" in str(_facts(_stage(data, "rng"))["host seed after"])
    outs = _table(_stage(data, "execute"), "buffers")["rows"]
    assert len(outs) == 1 and "keeps its pending IR" in outs[0][5]

    # a graph hash (a prefix will do) walks the last lookup of that key
    key = data["lookups"][1]["hash"]
    page2 = os.path.join(run_dir, "hash.html")
    assert cli.main(["explain", "--walk", "--sync", key[:10], os.path.join(run_dir, "train.py"), "-o", page2]) == 0
    _, data2 = _read(page2)
    assert data2["walked"] == 4 and data2["lookups"][3]["hash"] == key
    # -1 is the last, -2 the one before it
    page3 = os.path.join(run_dir, "neg.html")
    assert cli.main(["explain", "--walk", "--sync", "-2", "-o", page3, os.path.join(run_dir, "train.py")]) == 0
    assert _read(page3)[1]["walked"] == 3
    capsys.readouterr()


FAILS = textwrap.dedent("""\
    import jax
    import torch
    import lazyxla
    from lazyxla import lowering
    lib = torch.library.Library("walkfail", "DEF")
    lib.define("bad(Tensor x) -> Tensor")

    @torch.library.register_fake("walkfail::bad")
    def _fake(x):
        return torch.empty_like(x)

    def _explode(x):
        raise ValueError("the device program hit a bad value")

    @lowering.register(torch.ops.walkfail.bad.default)
    def _lower(sig, x):
        return jax.pure_callback(_explode, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    x = torch.ones(3).to(lazyxla.device()) * 2
    lazyxla.sync()
    y = torch.ops.walkfail.bad(x) + 1  # BAD
    lazyxla.sync()  # FAILS
    lazyxla.wait_device_ops()  # RAISES
    print("not reached")
""")


def test_walk_of_a_sync_that_failed(run_dir, capsys):
    script = os.path.join(run_dir, "fails.py")
    with open(script, "w") as f:
        f.write(FAILS)
    page = os.path.join(run_dir, "fails.html")
    assert cli.main(["explain", "--walk", script, "-o", page]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "bad value" in err
    text, data = _read(page)
    last = data["lookups"][-1]
    assert (last["cause"], last["outcome"]) == ("sync", "compile, failed running")
    assert last["where"] == f"fails.py:{_line('# FAILS', FAILS)}"
    assert data["walked"] == last["n"] and data["meta"]["exit_code"] == 1
    assert f"fails.py:{_line('# RAISES', FAILS)}" in data["meta"]["error"]
    assert 'id="script-error"' in text and "bad value" in data["meta"]["error"]
    ex = _stage(data, "execute")
    assert ex["status"] == "failed" and any("failed while running" in t and "bad value" in t for t in ex["text"])
    assert re.search(r'data-stage="execute" data-source="[^"]+" data-status="failed"', text)
    # what there is is still shown: the fold of its key, the arena with the failing op's line
    assert _stage(data, "hash")["steps"][-1]["digest"] == last["hash"]
    rows = _table(_stage(data, "arena"), "live tensors")["rows"]
    assert any(r[4] == f"fails.py:{_line('# BAD', FAILS)}" and r[5] == "yes" for r in rows)


def test_a_compile_that_raises_is_a_failed_lookup(capsys):
    """A compile that raises never reaches the end of its lookup: the walk keeps what it saw
    before the compile and says the compile raised."""
    import torch
    import lazyxla
    from lazyxla.compiler import compile as compiler

    w = walk.Walker().start()
    real = compiler.compile_graph
    try:
        def refuse(*a, **k):
            raise lazyxla.ExecutionError("lazyxla: could not compile graph: XlaRuntimeError: out of memory")
        import lazyxla.engine.executor as ex
        ex.compile_graph = refuse
        t = torch.full((7,), 3.0, device=lazyxla.device()) * 5
        with pytest.raises(lazyxla.ExecutionError, match="out of memory"):
            lazyxla.sync()
    finally:
        ex.compile_graph = real
        w.stop()
    data = w.export(error="ExecutionError: out of memory")
    assert data["lookups"][-1]["outcome"] == "failed" and data["walked"] == data["lookups"][-1]["n"]
    lk = _stage(data, "lookup")
    assert lk["status"] == "failed" and any("compile raised" in x and "out of memory" in x for x in lk["text"])
    assert _stage(data, "execute")["status"] == "failed"
    rows = _table(_stage(data, "arena"), "live tensors")["rows"]
    assert any(r[1] == "[7]" and r[3] == "pending IR" and r[5] == "yes" for r in rows)
    del t


def test_walk_of_a_run_without_a_sync(run_dir, capsys):
    script = os.path.join(run_dir, "nosync.py")
    with open(script, "w") as f:
        f.write("import torch\nimport lazyxla\nt = torch.ones(5, device=lazyxla.device()) + 1  # PENDING\n")
    page = os.path.join(run_dir, "nosync.html")
    assert cli.main(["explain", "--walk", script, "-o", page]) == 0
    assert "nothing walked (0 lookups)" in capsys.readouterr().err
    text, data = _read(page)
    assert data["walked"] is None and data["lookups"] == []
    assert "synced nothing" in data["note"] and 'id="walk-note"' in text
    assert [s["name"] for s in data["stages"]] == STAGES
    rows = _table(_stage(data, "arena"), "live tensors")["rows"]
    assert any(r[1] == "[5]" and r[3] == "pending IR" and r[4] == "nosync.py:3" for r in rows)
    for name in ("hash", "lookup", "donation", "lowering", "execute"):
        assert _stage(data, name)["status"] == "none"


def test_walk_arguments_and_exit_codes(run_dir, capsys):
    script = os.path.join(run_dir, "exits.py")
    with open(script, "w") as f:
        f.write("import sys\nsys.exit(3)\n")
    out = os.path.join(run_dir, "exits.html")
    assert cli.main(["explain", "--walk", script, "-o", out]) == 3 and os.path.exists(out)
    assert cli.main(["explain", "--walk", os.path.join(run_dir, "nope.py")]) == 2
    assert "no such script" in capsys.readouterr().err
    assert cli.main(["explain", "--sync", "2", script]) == 2
    assert "needs --walk" in capsys.readouterr().err
    for bad in ("0", "zz", "12ab!"):
        assert cli.main(["explain", "--walk", "--sync", bad, script, "-o", out]) == 2
        assert "--sync" in capsys.readouterr().err
    page = os.path.join(run_dir, "nomatch.html")
    assert cli.main(["explain", "--walk", "--sync", "99", "-o", page, os.path.join(run_dir, "train.py")]) == 0
    capsys.readouterr()
    _, data = _read(page)
    assert data["walked"] is None and "No lookup of this run matches --sync 99" in data["note"]


# ---------------------------------------------------------------------------------------
def test_browser_steps_through_the_stages(walked):
    from test_fold_page import CHROMIUM, Chromium
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    p, page = walked
    assert p.returncode == 0, p.stderr
    br = Chromium()
    try:
        br.open(page)
        state = "document.getElementById('walk').dataset"
        assert br.js(f"{state}.step") == "0" and br.js(f"{state}.total") == "8"
        assert br.js("document.querySelectorAll('section.stage.pending').length") == 8
        assert br.js("document.querySelector('tr.lookup-row.walked').dataset.n") == "4"
        for n in range(1, 9):
            br.js("document.getElementById('btn-step').click()")
            got = br.js("""(() => { const c = document.querySelectorAll('section.stage.current');
                return {step: document.getElementById('walk').dataset.step, n: c.length,
                        stage: c.length ? c[0].dataset.stage : null,
                        source: c.length ? c[0].dataset.source : null,
                        mark: c.length ? c[0].querySelector('.src-line.mark').offsetHeight : 0,
                        shown: document.querySelectorAll('section.stage.shown').length}; })()""")
            assert got["step"] == str(n) and got["n"] == 1 and got["stage"] == STAGES[n - 1], got
            assert got["shown"] == n and got["mark"] > 0  # the working line is on screen
            assert re.fullmatch(r"lazyxla/(\w+/)*\w+\.py:\d+", got["source"])
        assert br.js(f"{state}.done") == "true" and br.js("document.getElementById('btn-step').disabled") is True
        # the keyboard: left arrow back, right arrow on, r resets
        key = "document.dispatchEvent(new KeyboardEvent('keydown', {key: '%s'}))"
        br.js(key % "ArrowLeft")
        assert br.js(f"{state}.step") == "7"
        br.js(key % "ArrowRight")
        assert br.js(f"{state}.step") == "8"
        br.js(key % "r")
        assert br.js(f"{state}.step") == "0" and br.js("document.querySelectorAll('section.stage.shown').length") == 0
        br.js(key % "j")
        assert br.js("document.querySelector('section.stage.current').dataset.stage") == "cache"
        # Play runs to the end
        br.js("document.getElementById('btn-reset').click()")
        br.js("document.getElementById('btn-play').click()")
        deadline = time.monotonic() + 20
        while br.js(f"{state}.done") != "true":
            assert time.monotonic() < deadline, "Play did not finish"
            time.sleep(0.1)
        assert br.js("document.querySelector('section.stage.current').dataset.stage") == "execute"
    finally:
        br.close()
