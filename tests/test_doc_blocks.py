"""Every ```python block of README.md and of the manual (docs/**/*.md) runs as written.

A page's blocks run in order in one fresh Python process (in a temporary directory, with the
installed lazyxla, as a user runs a page top to bottom), each block in the namespace the blocks
before it left, each reported as its own test. A traceback names the page and the page's line
(``docs/guide/replay.md``, line 31). A block that cannot run here by nature (it needs several
processes, a TPU, a file the user has) says so on the line right before its fence:

    <!-- docs-test: skip (needs several processes under torchrun) -->

and is reported as skipped with that reason. A block that needs a process of its own (it sets an
environment variable read at import) starts one:

    <!-- docs-test: new-process -->

and the page's later blocks run in that new process. Shell and text blocks are not run. A
``docs-test`` comment that is not one of these right before a ```python fence is an error, so a
misspelled one cannot skip a block silently. Pages (and new-process parts) run ``PARALLEL`` at a
time, one process each.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parent.parent
PAGES = [CHECKOUT / "README.md", *sorted((CHECKOUT / "docs").rglob("*.md"))]
TIMEOUT = 300          # seconds per process (a page's blocks together)
PARALLEL = 2           # processes at once (this machine has 2 cores)
MARKER = re.compile(r"<!--\s*docs-test:\s*(?:skip\s*\((?P<reason>.+)\)|(?P<new>new-process))\s*-->")
FENCE = re.compile(r"^(\s*)```\s*(\w*)")

# Runs in the page's process: each block compiled with the page's name and line numbers, run in
# one namespace, its outcome appended to the results file as one JSON line.
DRIVER = r"""
import contextlib, io, json, sys, traceback
blocks, out = json.load(open(sys.argv[1])), sys.argv[2]
ns = {"__name__": "__main__"}
for b in blocks:
    stdout, stderr = io.StringIO(), io.StringIO()
    error = None
    try:
        code = compile("\n" * b["line"] + b["code"], b["page"], "exec")
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            exec(code, ns)
    except SystemExit as e:
        if e.code not in (None, 0):
            error = f"SystemExit({e.code!r})"
    except BaseException:
        error = traceback.format_exc()
    with open(out, "a") as f:
        f.write(json.dumps({"id": b["id"], "error": error, "stdout": stdout.getvalue(),
                            "stderr": stderr.getvalue()}) + "\n")
"""


class Block:
    def __init__(self, page, line, code, skip, session):
        self.page, self.line, self.code, self.skip, self.session = page, line, code, skip, session
        self.id = f"{page}:{line}"


def parse(text: str, page: str) -> list[Block]:
    """The fenced ```python blocks of ``text``, each with its skip reason (or None) and the
    process it runs in (``page``, or ``page#N`` after the N-th new-process marker)."""
    lines = text.splitlines()
    blocks, markers = [], {n for n, ln in enumerate(lines) if "docs-test" in ln or "readme-test" in ln}
    session, i = page, 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2).lower(), i
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        if i == len(lines):
            raise ValueError(f"{page}:{start + 1}: fence never closed")
        before = start - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = MARKER.fullmatch(lines[before].strip()) if before >= 0 else None
        if lang in ("python", "py"):
            if marker:
                markers.discard(before)
                if marker.group("new"):
                    session = f"{page}#{start + 1}"
            code = "\n".join(ln[len(indent):] if ln.startswith(indent) else ln for ln in lines[start + 1:i])
            reason = marker.group("reason") if marker else None
            blocks.append(Block(page, start + 1, code + "\n", reason and reason.strip(), session))
        i += 1
    if markers:
        raise ValueError(f"{page}:{min(markers) + 1}: a docs-test comment that is not "
                         f"'<!-- docs-test: skip (REASON) -->' or '<!-- docs-test: new-process -->' "
                         f"right before a ```python fence")
    return blocks


BLOCKS = [b for p in PAGES for b in parse(p.read_text(encoding="utf-8"), p.relative_to(CHECKOUT).as_posix())]


def _run(blocks, cwd: Path):
    """{block id: (error or None, stdout, stderr)} of the blocks run in one new process; a block
    the process never reported (it crashed or ran out of time) is missing."""
    cwd.mkdir()
    spec, out = cwd / "blocks.json", cwd / "results.jsonl"
    spec.write_text(json.dumps([{"id": b.id, "page": b.page, "line": b.line, "code": b.code} for b in blocks]))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)  # the installed lazyxla, as a user's script imports it
    try:
        r = subprocess.run([sys.executable, "-c", DRIVER, str(spec), str(out)], cwd=cwd, env=env,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT)
        ended = f"exited {r.returncode}", r.stderr
    except subprocess.TimeoutExpired as e:
        ended = f"did not finish in {TIMEOUT} s", (e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes)
                                                    else e.stderr or "")
    got = {}
    if out.exists():
        for line in out.read_text().splitlines():
            rec = json.loads(line)
            got[rec["id"]] = (rec["error"], rec["stdout"], rec["stderr"])
    return got, ended


@pytest.fixture(scope="module")
def results(request, tmp_path_factory):
    """Every process whose blocks this session selected (``-k``, a node id), started at once,
    PARALLEL at a time; a selected block runs with the blocks of its process before it."""
    chosen = {item.callspec.params["block"].session for item in request.session.items
              if item.module is request.module and "block" in getattr(getattr(item, "callspec", None), "params", {})}
    root = tmp_path_factory.mktemp("docs")
    sessions = {}
    for b in BLOCKS:
        if b.session in chosen and b.skip is None:
            sessions.setdefault(b.session, []).append(b)
    with ThreadPoolExecutor(PARALLEL) as pool:
        futures = {s: pool.submit(_run, bs, root / f"p{k}") for k, (s, bs) in enumerate(sessions.items())}
        yield futures


def test_blocks_found():
    assert BLOCKS, "no ```python block in README.md or docs/"
    assert any(b.page == "README.md" and b.skip is None for b in BLOCKS), "README.md has no runnable example"


@pytest.mark.parametrize("block", [
    pytest.param(b, id=b.id, marks=[pytest.mark.skip(reason=f"{b.id}: {b.skip}")] if b.skip else [])
    for b in BLOCKS])
def test_doc_block(block, results):
    got, (ended, proc_err) = results[block.session].result()
    head = "\n".join("    " + ln for ln in block.code.strip().splitlines()[:8])
    if block.id not in got:
        pytest.fail(f"{block.id} did not report: its process {ended}; the block starts:\n{head}\n"
                    f"stderr (last lines):\n{_tail(proc_err)}", pytrace=False)
    error, out, err = got[block.id]
    if error is not None:
        pytest.fail(f"{block.id} raised; it starts:\n{head}\n{error}\nstdout (last lines):\n{_tail(out, 5)}\n"
                    f"stderr (last lines):\n{_tail(err)}", pytrace=False)


def _tail(text, n=25):
    return "\n".join(text.rstrip().splitlines()[-n:]) or "(empty)"
