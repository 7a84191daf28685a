"""Every ```python block of README.md runs as written: each in a fresh ``python -c`` process,
in a temporary directory, and must exit 0.

A block that cannot run on its own by nature (it needs a file the user has, several processes,
a GPU, the network or a huge model) says so in the README, on the line right before its fence:

    <!-- readme-test: skip (needs several processes under torchrun) -->

and is reported as skipped with that reason. Shell blocks are not run. A ``readme-test``
comment that is not such a marker right before a ```python fence is an error, so a misspelled
one cannot skip a block silently. The blocks run ``PARALLEL`` at a time (one process each).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
TIMEOUT = 120          # seconds per block
PARALLEL = 2           # blocks run at once (this machine has 2 cores)
SKIP = re.compile(r"<!--\s*readme-test:\s*skip\s*\((.+)\)\s*-->")
FENCE = re.compile(r"^(\s*)```\s*(\w*)")


class Block:
    def __init__(self, line, code, skip):
        self.id, self.code, self.skip = f"line{line}", code, skip


def parse(text: str) -> list[Block]:
    """The fenced ```python blocks of ``text``, each with its skip reason (or None)."""
    lines = text.splitlines()
    blocks, markers = [], {n for n, ln in enumerate(lines) if "readme-test" in ln}
    i = 0
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
            raise ValueError(f"README.md:{start + 1}: fence never closed")
        before = start - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        skip = SKIP.fullmatch(lines[before].strip()) if before >= 0 else None
        if lang in ("python", "py"):
            markers.discard(before if skip else -1)
            code = "\n".join(ln[len(indent):] if ln.startswith(indent) else ln for ln in lines[start + 1:i])
            blocks.append(Block(start + 1, code + "\n", skip.group(1).strip() if skip else None))
        i += 1
    if markers:
        raise ValueError(f"README.md:{min(markers) + 1}: a readme-test comment that is not "
                         f"'<!-- readme-test: skip (REASON) -->' right before a ```python fence")
    return blocks


BLOCKS = parse(README.read_text(encoding="utf-8"))


def _run(code: str, cwd: Path):
    """(exit code, or None after ``TIMEOUT``; stdout; stderr) of the code in a new process."""
    cwd.mkdir()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)  # the installed lazyxla, as a user's script imports it
    try:
        r = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=TIMEOUT)
        return r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        text = [x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr)]
        return None, *text


@pytest.fixture(scope="module")
def results(request, tmp_path_factory):
    """Every block this session selected (``-k``, a node id), started at once, PARALLEL at a time."""
    chosen = [item.callspec.params["block"] for item in request.session.items
              if item.module is request.module and "block" in getattr(getattr(item, "callspec", None), "params", {})]
    root = tmp_path_factory.mktemp("readme")
    with ThreadPoolExecutor(PARALLEL) as pool:
        yield {b.id: pool.submit(_run, b.code, root / b.id) for b in chosen if b.skip is None}


def test_blocks_found():
    assert BLOCKS, "no ```python block in README.md"


@pytest.mark.parametrize("block", [
    pytest.param(b, id=b.id, marks=[pytest.mark.skip(reason=f"README.md {b.id}: {b.skip}")] if b.skip else [])
    for b in BLOCKS])
def test_readme_block(block, results):
    rc, out, err = results[block.id].result()
    if rc != 0:
        head = "\n".join("    " + ln for ln in block.code.strip().splitlines()[:8])
        what = f"did not finish in {TIMEOUT} s" if rc is None else f"exited {rc}"
        pytest.fail(f"README.md {block.id} {what}; it starts:\n{head}\n"
                    f"stdout (last lines):\n{_tail(out, 5)}\nstderr (last lines):\n{_tail(err)}", pytrace=False)


def _tail(text, n=25):
    return "\n".join(text.rstrip().splitlines()[-n:]) or "(empty)"
