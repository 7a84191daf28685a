"""Writing a file atomically: readers see the old file or the whole new one, never a part.

``write_atomic(path, data)`` writes into a temp file in the same directory, named
``.<file name>.<pid>.<random>.tmp``, then renames it into place (``os.replace``) or, with
``replace=False``, links it into place only if nothing is there yet (``os.link``: an existing
file is never replaced). The temp file is removed whether or not the write succeeds; a process
killed mid-write leaves only its temp file, never a partial ``path``.

May touch: ``path`` and its temp file, nothing else.
"""
from __future__ import annotations

import os
import tempfile


def write_atomic(path, data, mode: int = 0o600, fsync: bool = True, replace: bool = True) -> None:
    """Write ``data`` (bytes, or an iterable of bytes chunks written in order) to ``path``.

    ``mode``: the file's permission bits (set on the temp file, so ``path`` never has other
    ones). ``fsync``: flush the file to disk before it is put in place, and the directory
    after (a directory that cannot be fsynced is no error). ``replace=False``: raise
    FileExistsError, writing nothing, when ``path`` exists. Raises OSError on failure.
    """
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.{os.getpid()}.", suffix=".tmp", dir=d)
    placed = False
    try:
        try:
            os.fchmod(fd, mode)
            for chunk in ([data] if isinstance(data, (bytes, bytearray, memoryview)) else data):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.replace(tmp, path)
            placed = True
        else:
            os.link(tmp, path)
    finally:
        if not placed:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    if fsync:
        _fsync_directory(d)


def _fsync_directory(d: str) -> None:
    try:
        dfd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
