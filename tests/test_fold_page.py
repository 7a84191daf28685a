"""R15.3: the fold page (lazyxla/debug/fold_page.py) and ``lazyxla explain SCRIPT [ARGS...] -o PAGE``.

The page is self-contained and lists every key; the command writes it for a script that
recompiles (exit 0), for one that raises (the page for what ran first, exit 1), passes a
script's ``sys.exit(3)`` on, and names a missing script in one line (exit 2). A real headless
Chromium (Debian's ``chromium``, driven over the DevTools protocol on a pipe, no extra package)
opens the page, clicks a recompile record's "compare", steps the animation to the end, and
checks that the merge marked ``first-divergence`` is the first one whose ingredients differ:
``tensors`` for a batch-size change, ``force_ltc_data`` for a value read followed by a sync.
Without chromium the browser tests skip, except under CI, where they fail.
"""
from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from lazyxla import cli
from lazyxla.debug import fold_page

SITES = ["force_ltc_data", "environment", "tensors", "parameters", "donation", "sharding"]

SCRIPT = textwrap.dedent("""\
    import sys
    import torch
    import lazyxla
    DEV = lazyxla.device()
    w = torch.randn(29, 3).to(DEV)
    lazyxla.sync()
    for bs in (8, 8, 5):
        x = torch.randn(bs, 29).to(DEV)
        y = (x @ w).relu().sum()  # MATMUL
        lazyxla.sync()
    a = torch.ones(31).to(DEV)
    lazyxla.sync()
    b = a * 3 + 2
    print(b.sum())
    lazyxla.sync()
    print("args", sys.argv[1:], __name__)
""")
MATMUL_LINE = next(i for i, line in enumerate(SCRIPT.splitlines(), 1) if "# MATMUL" in line)

RAISES = textwrap.dedent("""\
    import torch
    import lazyxla
    x = (torch.ones(7).to(lazyxla.device()) * 2).sum()
    lazyxla.sync()
    1 / 0
""")


def _embedded(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="fold-data">(.*?)</script>', page, re.S)
    assert m, "no embedded data"
    return json.loads(m.group(1))


def _cli(args, cwd, timeout=240):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "lazyxla", "explain", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def run_dir():
    d = tempfile.mkdtemp(prefix="lazyxla-fold-test-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def recompiling_page(run_dir):
    """``lazyxla explain recompiles.py one two -o page.html``, run once for the module."""
    script = os.path.join(run_dir, "recompiles.py")
    with open(script, "w") as f:
        f.write(SCRIPT)
    p = _cli(["recompiles.py", "one", "two", "-o", "page.html"], cwd=run_dir)
    page = os.path.join(run_dir, "page.html")
    return p, page


# ---------------------------------------------------------------------------------------
def test_render_is_self_contained_and_lists_every_key():
    keys = [{"hash": f"{i:032x}", "uses": i + 1, "compile_ms": 10.0 * i, "cause": "sync",
             "steps": [{"site": "force_ltc_data", "summary": "force_ltc_data=true", "ingredient": "ab" * 16,
                        "digest": "ab" * 16},
                       {"site": "tensors", "summary": "tensor 1: </script><b>x</b>", "ingredient": f"{i:032x}",
                        "digest": f"{i + 7:032x}",
                        "ir": {"nodes": [{"id": 0, "op": "aten::add", "outs": ["f32[2]"], "where": "t.py:3",
                                          "hash": f"{i:032x}", "params": "(%0, %0)", "operands": []}],
                               "root": 0, "output": 0}}]}
            for i in range(3)]
    data = {"keys": keys, "records": [{"index": 2, "site": "tensors", "text": "x </script> y", "hash": keys[1]["hash"],
                                       "closest": keys[0]["hash"], "compile_ms": 10.0, "where": ["t.py", 3, "f"]}],
            "sites": SITES}
    page = fold_page.render(data)
    assert page.startswith("<!DOCTYPE html>")
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"""\s(src|href)\s*=\s*["']?(?!#)""", page), "external reference"
    assert "<link" not in page and "@import" not in page
    assert page.count("</script>") == 2  # the data's "</script>" is escaped
    assert _embedded(page) == data
    for k in keys:
        assert k["hash"] in page
    with tempfile.TemporaryDirectory() as d:
        out = fold_page.write(os.path.join(d, "f.html"), data)
        with open(out, encoding="utf-8") as f:
            assert f.read() == page


def test_explain_cli_writes_the_page(recompiling_page):
    p, page = recompiling_page
    assert p.returncode == 0, p.stdout + p.stderr
    assert "args ['one', 'two'] __main__" in p.stdout
    assert os.path.abspath(page) in p.stderr
    with open(page, encoding="utf-8") as f:
        text = f.read()
    assert "http://" not in text and "https://" not in text
    data = _embedded(text)
    assert len(data["keys"]) == 4, [r["text"] for r in data["records"]]
    assert [r["site"] for r in data["records"]] == [None, "tensors", "force_ltc_data", "force_ltc_data"]
    assert data["meta"]["exit_code"] == 0 and data["meta"]["argv"] == ["one", "two"]
    assert sum(k["uses"] for k in data["keys"]) == 5  # bs 8 twice
    for k in data["keys"]:
        assert k["hash"] in text
        assert [s["site"] for s in k["steps"]] == ["force_ltc_data", "environment", "tensors", "parameters",
                                                    "sharding"]


def test_explain_cli_script_that_raises(run_dir):
    with open(os.path.join(run_dir, "raises.py"), "w") as f:
        f.write(RAISES)
    p = _cli(["-o", "raised.html", "raises.py"], cwd=run_dir)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "Traceback (most recent call last)" in p.stderr and "ZeroDivisionError" in p.stderr
    assert 'raises.py", line 5' in p.stderr
    assert "runpy" not in p.stderr  # the traceback starts at the script, as Python's does
    with open(os.path.join(run_dir, "raised.html"), encoding="utf-8") as f:
        data = _embedded(f.read())
    assert len(data["keys"]) == 1 and data["meta"]["exit_code"] == 1


def test_explain_cli_exit_code_and_missing_script(run_dir, capsys):
    script = os.path.join(run_dir, "exits.py")
    with open(script, "w") as f:
        f.write("import sys\nprint('bye', sys.argv[1:])\nsys.exit(3)\n")
    out = os.path.join(run_dir, "exits.html")
    import torch
    import lazyxla
    (torch.ones(3).to(lazyxla.device()) * 7).cpu()  # a compile of this process's, before the script
    assert cli.main(["explain", script, "x", "-o", out]) == 3
    said = capsys.readouterr()
    assert "bye ['x']" in said.out
    assert "(0 keys, 0 recompiles explained)" in said.err, said.err  # the page is the script's alone
    assert os.path.exists(out)
    assert cli.main(["explain", os.path.join(run_dir, "nope.py"), "-o", out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such script" in err and "nope.py" in err
    p = _cli(["no-such-script.py"], cwd=run_dir, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "no-such-script.py" in p.stderr, p.stderr


# ---------------------------------------------------------------------------------------
# A minimal DevTools-protocol client over --remote-debugging-pipe (fd 3: commands in, fd 4: replies out).
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)


class Chromium:
    def __init__(self, width=1400, height=1000):
        self.profile = tempfile.mkdtemp(prefix="lazyxla-chromium-")
        to_r, self._to_w = os.pipe()      # we write commands; chromium reads them on fd 3
        self._from_r, from_w = os.pipe()  # chromium writes replies on fd 4
        # the child's ends above fd 4, so that moving them to 3 and 4 cannot clobber each other
        to_r, from_w = [self._high(fd) for fd in (to_r, from_w)]
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-extensions", "--disable-dev-shm-usage", "--mute-audio", "--hide-scrollbars",
                 f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
                 "--remote-debugging-pipe", "about:blank"]
        sh = f'exec "$0" "$@" 3<&{to_r} 4>&{from_w} {to_r}<&- {from_w}>&-'
        self.proc = subprocess.Popen(["bash", "-c", sh, CHROMIUM, *flags], pass_fds=(to_r, from_w),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        os.close(to_r)
        os.close(from_w)
        self._buf = b""
        self._id = 0
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Runtime.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    @staticmethod
    def _high(fd):
        import fcntl
        hi = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
        os.close(fd)
        return hi

    def _read(self, deadline):
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer")
            r, _, _ = select.select([self._from_r], [], [], left)
            if r:
                chunk = os.read(self._from_r, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the pipe")
                self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, session=False, timeout=30, **params):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def js(self, expr):
        r = self.call("Runtime.evaluate", session=True, expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise AssertionError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def open(self, path):
        self.call("Page.navigate", session=True, url="file://" + os.path.abspath(path))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if self.js("document.readyState === 'complete' && document.body.dataset.ready === 'true'"):
                    return
            except (AssertionError, RuntimeError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"page {path} did not get ready")

    def screenshot(self, path, full_page=True):
        import base64
        params = {"format": "png"}
        if full_page:
            m = self.call("Page.getLayoutMetrics", session=True)
            size = m.get("cssContentSize") or m["contentSize"]
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1})
        png = base64.b64decode(self.call("Page.captureScreenshot", session=True, **params)["data"])
        with open(path, "wb") as f:
            f.write(png)
        return path

    def close(self):
        try:
            self.call("Browser.close", timeout=5)
        except Exception:  # noqa: BLE001
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_w, self._from_r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium); the fold page's "
                        "browser test cannot run")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    b = Chromium()
    yield b
    b.close()


def expected_first_divergence(data, a, b):
    """The first merge, in R3's order (tensors one by one), whose ingredient differs."""
    steps = {k["hash"]: k["steps"] for k in data["keys"]}
    for site in data["sites"]:
        sa = [s["ingredient"] for s in steps[a] if s["site"] == site]
        sb = [s["ingredient"] for s in steps[b] if s["site"] == site]
        for i in range(max(len(sa), len(sb))):
            if i >= len(sa) or i >= len(sb) or sa[i] != sb[i]:
                return site, i
    return None, None


def _compare_and_step(br, index):
    br.js(f"document.querySelector('li.record[data-index=\"{index}\"] button.compare').click()")
    total = br.js("+document.getElementById('compare-view').dataset.total")
    assert total >= 5
    assert br.js("document.querySelectorAll('tr.cmp-row.pending').length") == total
    assert br.js("document.querySelectorAll('tr.cmp-row.first-divergence').length") == 0  # not yet revealed
    for n in range(1, total + 1):
        br.js("document.getElementById('btn-step').click()")
        assert br.js("+document.getElementById('compare-view').dataset.step") == n
    assert br.js("document.getElementById('compare-view').dataset.done") == "true"
    assert br.js("document.getElementById('btn-step').disabled") is True
    return br.js("""(() => {
        const rows = [...document.querySelectorAll('tr.cmp-row')];
        const f = rows.filter(r => r.classList.contains('first-divergence'));
        return {n: rows.length, pending: rows.filter(r => r.classList.contains('pending')).length,
                first: f.map(r => [+r.dataset.row, r.dataset.site]),
                diverged: rows.filter(r => r.classList.contains('diverged')).map(r => +r.dataset.row),
                sites: rows.map(r => r.dataset.site),
                a: document.getElementById('compare-view').dataset.a,
                b: document.getElementById('compare-view').dataset.b};
    })()""")


def test_browser_marks_the_first_diverging_merge(recompiling_page, browser):
    p, page = recompiling_page
    assert p.returncode == 0, p.stdout + p.stderr
    with open(page, encoding="utf-8") as f:
        data = _embedded(f.read())
    browser.open(page)
    assert browser.js("document.querySelectorAll('tr.key-row').length") == len(data["keys"])
    checked = set()
    for rec in data["records"]:
        if rec["closest"] is None or rec["site"] in checked:
            continue
        checked.add(rec["site"])
        site, i = expected_first_divergence(data, rec["closest"], rec["hash"])
        assert site == rec["site"]
        got = _compare_and_step(browser, rec["index"])
        assert (got["a"], got["b"]) == (rec["closest"], rec["hash"])
        assert got["pending"] == 0
        assert len(got["first"]) == 1, got
        row, marked_site = got["first"][0]
        assert marked_site == site
        assert row == got["sites"].index(site) + i  # the i-th merge of that site
        assert got["diverged"] == list(range(row, got["n"]))  # every later digest diverges
        if site == "tensors":
            # the tensor merge opened into the IR diff, naming the user's line of the matmul
            ir = browser.js("""(() => { const d = document.querySelector('div.ir-diff');
                return d ? {n: +d.dataset.differing, text: d.textContent} : null; })()""")
            assert ir and ir["n"] > 0, ir
            assert f"recompiles.py:{MATMUL_LINE}" in ir["text"], ir["text"][:2000]
            assert "f32[5, 29]" in ir["text"] and "f32[8, 29]" in ir["text"]
    assert checked == {"tensors", "force_ltc_data"}

    # picking two keys by hand (A, B) compares them too; Play runs to the end; Reset hides the rows
    k0, k1 = data["keys"][0]["hash"], data["keys"][2]["hash"]
    browser.js(f"document.querySelector('button.pick-a[data-hash=\"{k0}\"]').click();"
               f"document.querySelector('button.pick-b[data-hash=\"{k1}\"]').click();")
    assert browser.js("document.getElementById('compare-view').dataset.b") == k1
    browser.js("document.getElementById('btn-play').click()")
    deadline = time.monotonic() + 15
    while browser.js("document.getElementById('compare-view').dataset.done") != "true":
        assert time.monotonic() < deadline, "Play did not finish"
        time.sleep(0.1)
    site, _ = expected_first_divergence(data, k0, k1)
    assert browser.js("document.querySelector('tr.cmp-row.first-divergence').dataset.site") == site
    browser.js("document.getElementById('btn-reset').click()")
    assert browser.js("document.querySelectorAll('tr.cmp-row.shown').length") == 0
