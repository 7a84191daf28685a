"""glibc's mmap threshold fixed at ``import lazyxla``: large blocks freed go back to the system,
so a process does not keep the high-water mark of every buffer it freed (``host_memory``)."""
import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")

_SCRIPT = r"""
import json, torch, lazyxla
from lazyxla import host_memory
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) / 1024
big = torch.ones(4 << 20)           # 16 MB, freed: glibc would now serve blocks below it from the heap
del big
base = rss()
blocks = [torch.ones(2 << 20) for _ in range(50)]    # 50 blocks of 8 MB
keep = blocks[-1]                   # the last one stays: the heap could not shrink past it
del blocks
print(json.dumps({"held_mb": rss() - base, "threshold": host_memory._set}))
"""


def _run(**env):
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, check=True,
                         env={**os.environ, **env}).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_freed_buffers_leave_the_process_and_off_they_stay():
    on = _run()
    assert on["threshold"] == 4 << 20
    assert on["held_mb"] < 40, on          # the one block kept, not the 400 MB freed
    off = _run(LAZYXLA_MALLOC_MMAP_THRESHOLD="0")
    assert off["threshold"] is None
    assert off["held_mb"] > 200, off       # glibc's own rule: the heap keeps them


def test_a_threshold_the_user_set_is_left_alone():
    got = _run(MALLOC_MMAP_THRESHOLD_="65536")
    assert got["threshold"] is None and got["held_mb"] < 40, got
