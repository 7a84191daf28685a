"""Every ```python block of README.md runs as written: each in a fresh ``python -c`` process,
in a temporary directory, and must exit 0.

A block that cannot run on its own by nature (it needs a file the user has, several processes,
a GPU, the network or a huge model) says so in the README, on the line right before its fence:

    <!-- readme-test: skip (needs several processes under torchrun) -->

and is reported as skipped with that reason. A fragment that continues the block before it says

    <!-- readme-test: after previous -->

and runs concatenated with that block (and whatever that one continues). Shell blocks are not
run. Any other ``readme-test`` comment, or one not right before a ```python fence, is an error.

The first case to ask for its result starts the blocks the session selected, one process each,
``PARALLEL`` at a time, so both cores work while pytest waits on one block.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
TIMEOUT = 120          # seconds per block
PARALLEL = 2           # blocks run at once (this machine has 2 cores)
MARKER = re.compile(r"<!--\s*readme-test:\s*(.*?)\s*-->")
SKIP = re.compile(r"skip\s*\((.+)\)\Z")
FENCE = re.compile(r"^(\s*)```(.*)$")


class Block:
    def __init__(self, index, line, lang, code, marker):
        self.index, self.line, self.lang, self.code, self.marker = index, line, lang, code, marker
        self.skip = None        # the reason, for a block marked skip
        self.after = False      # a fragment run after the block before it
        self.prev = None        # the python block before this one
        if marker is not None:
            m = SKIP.match(marker)
            if m:
                self.skip = m.group(1).strip()
            elif marker == "after previous":
                self.after = True
            else:
                raise ValueError(f"README.md:{line}: unknown readme-test marker {marker!r} (expected "
                                 f"'skip (REASON)' or 'after previous')")

    @property
    def id(self):
        return f"block{self.index:02d}-line{self.line}"

    def source(self) -> str:
        """The block's code, preceded by the blocks it continues."""
        if not self.after:
            return self.code
        if self.prev is None:
            raise ValueError(f"README.md:{self.line}: 'after previous' on the first python block")
        return self.prev.source() + "\n" + self.code


def parse(text: str) -> list[Block]:
    """The fenced ```python blocks of ``text``, numbered from 1, each with its opening fence's
    line and the readme-test marker right before that fence (blank lines between allowed)."""
    lines = text.splitlines()
    blocks, markers_used = [], set()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2).strip().split()[0].lower() if m.group(2).strip() else ""
        start = i
        j = i + 1
        while j < len(lines) and not re.match(rf"^{re.escape(indent)}```\s*$", lines[j]):
            j += 1
        if j == len(lines):
            raise ValueError(f"README.md:{start + 1}: fence never closed")
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mm = MARKER.fullmatch(lines[k].strip()) if k >= 0 else None
        if mm:
            markers_used.add(k)
        if lang in ("python", "py"):
            body = "\n".join(ln[len(indent):] if ln.startswith(indent) else ln for ln in lines[start + 1:j])
            blocks.append(Block(len(blocks) + 1, start + 1, lang, body + "\n", mm.group(1) if mm else None))
        elif mm:
            raise ValueError(f"README.md:{k + 1}: readme-test marker before a ```{lang} block, not a python one")
        i = j + 1
    for n, ln in enumerate(lines):
        if MARKER.search(ln) and n not in markers_used:
            raise ValueError(f"README.md:{n + 1}: readme-test marker not right before a ```python fence")
    for prev, b in zip(blocks, blocks[1:]):
        b.prev = prev
    for b in blocks:
        b.source()  # an 'after previous' with nothing before it raises here
    return blocks


BLOCKS = parse(README.read_text(encoding="utf-8"))


def params():
    out = []
    for b in BLOCKS:
        marks = ()
        if b.skip is not None:
            first = b.code.strip().splitlines()[0] if b.code.strip() else ""
            marks = pytest.mark.skip(reason=f"README.md {b.id} ({first[:60]}): {b.skip}")
        out.append(pytest.param(b, id=b.id, marks=marks))
    return out


def run_env():
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the installed lazyxla, as a user's script imports it
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Runner:
    """Runs the blocks that are not skipped, ``PARALLEL`` at a time, each in its own process."""

    def __init__(self, blocks, root: Path):
        self.todo = [b for b in blocks if b.skip is None]  # in README order, the asked-for one first
        self.root = root
        self.procs = {}    # block id -> (Popen, out file, err file, start time)
        self.results = {}  # block id -> (returncode or None on timeout, stdout, stderr, seconds)

    def _start(self, b):
        cwd = self.root / b.id
        cwd.mkdir()
        out, err = open(cwd.parent / f"{b.id}.out", "w+"), open(cwd.parent / f"{b.id}.err", "w+")
        p = subprocess.Popen([sys.executable, "-c", b.source()], cwd=cwd, env=run_env(),
                             stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        self.procs[b.id] = (p, out, err, time.monotonic())

    def _finish(self, bid, timeout):
        p, out, err, t0 = self.procs.pop(bid)
        try:
            rc = p.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = None
        out.seek(0)
        err.seek(0)
        self.results[bid] = (rc, out.read(), err.read(), time.monotonic() - t0)
        out.close()
        err.close()

    def result(self, b):
        if b.id not in self.results and b.id not in self.procs:  # not started yet: next
            if b in self.todo:
                self.todo.remove(b)
            self.todo.insert(0, b)
        while b.id not in self.results:
            while self.todo and len(self.procs) < PARALLEL:
                self._start(self.todo.pop(0))
            # wait for whichever running block ends first (in order of start when none has)
            done = [bid for bid, v in self.procs.items() if v[0].poll() is not None]
            if done:
                for bid in done:
                    self._finish(bid, 0)
                continue
            oldest = min(self.procs, key=lambda k: self.procs[k][3])
            left = TIMEOUT - (time.monotonic() - self.procs[oldest][3])
            if left <= 0:
                self._finish(oldest, 0)
            else:
                time.sleep(min(0.05, left))
        return self.results[b.id]

    def close(self):
        for bid in list(self.procs):
            self.procs[bid][0].kill()
            self._finish(bid, 5)


@pytest.fixture(scope="module")
def runner(request, tmp_path_factory):
    # only the blocks this session runs (``-k``, a node id): the others are never started
    chosen = {item.callspec.params["block"].id for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec") and "block" in item.callspec.params}
    r = Runner([b for b in BLOCKS if b.id in chosen], tmp_path_factory.mktemp("readme"))
    yield r
    r.close()


def test_blocks_found():
    assert len(BLOCKS) >= 1, "no ```python block in README.md"
    skipped = [f"{b.id}: {b.skip}" for b in BLOCKS if b.skip is not None]
    print(f"{len(BLOCKS)} python blocks, {len(skipped)} skipped:", *skipped, sep="\n  ")


@pytest.mark.parametrize("block", params())
def test_readme_block(block, runner):
    rc, out, err, secs = runner.result(block)
    if rc != 0:
        head = "\n".join("    " + ln for ln in block.code.strip().splitlines()[:8])
        what = f"did not finish in {TIMEOUT} s" if rc is None else f"exited {rc} after {secs:.1f} s"
        after = " (run after the block before it)" if block.after else ""
        pytest.fail(f"README.md {block.id}{after} {what}; it starts:\n{head}\n"
                    f"stdout (last lines):\n{_tail(out, 5)}\nstderr (last lines):\n{_tail(err)}", pytrace=False)


def _tail(text, n=25):
    return "\n".join(text.rstrip().splitlines()[-n:]) or "(empty)"
