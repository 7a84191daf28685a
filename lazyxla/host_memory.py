"""How the process's allocator gives freed buffers back: a fixed mmap threshold under glibc.

On the CPU, XLA's device buffers, a program's temporaries and PyTorch's host tensors are all
``malloc`` blocks. glibc serves a large block with its own ``mmap`` (returned to the system at
``free``) only above a threshold that it raises, up to 32 MB, each time such a block is freed.
A lazy step frees large blocks all the time (the donated inputs, the program's temporaries, the
model's CPU copy after ``.to(device)``), so after the first ones nearly every buffer comes from
the heap, and the heap keeps the pages of whatever it freed: the process holds the highest
water mark of every size it ever had. Here, at ``import lazyxla``, the threshold is fixed
(``mallopt``; fixing it also ends the raising), so a block of at least
``LAZYXLA_MALLOC_MMAP_THRESHOLD`` bytes (default 4 MiB) is mapped for itself and unmapped when
freed. Measured (``bench/models.py``, lazy, two runs each): ResNet-18's peak 869-899 -> 827-828 MB,
GPT-2's 835-846 -> 827-837, steps as fast. A lower threshold costs time: at 1 MiB every
activation of BERT's step is a new mapping whose pages fault in again each step (~10% slower)
for ~10 MB less.

Left alone: an allocator that is not glibc's (macOS, musl, a preloaded tcmalloc or jemalloc,
whose ``mallopt`` is absent or not this one), a threshold the user set
(``MALLOC_MMAP_THRESHOLD_``), and ``LAZYXLA_MALLOC_MMAP_THRESHOLD=0``.

May touch: glibc's malloc settings of this process, once.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import platform

from .config import env_int, env_str

THRESHOLD = env_int("LAZYXLA_MALLOC_MMAP_THRESHOLD", 4 << 20)
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h
_set = None  # the threshold fixed here, once done


def _glibc():
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    if any(k in env_str("LD_PRELOAD") for k in ("tcmalloc", "jemalloc", "mimalloc")):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") else None
    except OSError:
        return None


def install() -> int | None:
    """Fix glibc's mmap threshold (see above); the threshold set, or None where left alone."""
    global _set
    if _set is not None or THRESHOLD <= 0 or env_str("MALLOC_MMAP_THRESHOLD_"):
        return _set
    libc = _glibc()
    if libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(THRESHOLD)) == 1:
        _set = THRESHOLD
    return _set
