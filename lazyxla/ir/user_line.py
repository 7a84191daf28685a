"""The user's line: where in the user's Python a node was recorded.

A node keeps the site of the innermost frame outside library code (torch, lazyxla, JAX and
the standard library), as cheaply as it can be taken on the warm path (``user_site``: a code
object and a bytecode offset), resolved to (filename, lineno, function) only when read
(``resolve_site``). Errors, explanations and the walk name it with ``fmt_where``.

Touches nothing but its own memo of code objects and sites.
"""
from __future__ import annotations

import os
import sys
import threading

import torch


# Frames inside torch, lazyxla (the whole package, every stage of it), jax and the standard
# library are skipped.
_INTERNAL_DIRS = tuple(
    os.path.dirname(m.__file__) + os.sep
    for m in (torch, sys.modules[__name__.split(".", 1)[0]], threading, os)
)
_internal_code: dict = {}  # code object -> whether it is library code (not the user's)


def _is_internal(code) -> bool:
    r = _internal_code.get(code)
    if r is None:
        fn = code.co_filename
        r = fn.startswith(_INTERNAL_DIRS) or fn.startswith("<frozen") or "/site-packages/jax" in fn \
            or "/site-packages/jaxlib" in fn
        _internal_code[code] = r
    return r


_getframe = sys._getframe


def user_frame(depth: int = 2):
    """(filename, lineno, function) of the innermost frame outside library code, or None."""
    site = user_site(depth + 1)
    return None if site is None else resolve_site(site)


def user_site(depth: int = 2):
    """Where the user's line is, as cheaply as it can be said: the innermost frame outside
    library code as (code object, bytecode offset), or None. ``resolve_site`` turns it into
    ``user_frame``'s (filename, lineno, function) when someone reads it (``Node.where``)."""
    try:
        f = _getframe(depth)
    except ValueError:
        return None
    cache = _internal_code
    while f is not None:
        c = f.f_code
        r = cache.get(c)
        if r is None:
            r = _is_internal(c)
        if not r:
            return (c, f.f_lasti)
        f = f.f_back
    return None


_SITES: dict = {}


def resolve_site(site):
    """(filename, lineno, function) of a ``user_site``."""
    w = _SITES.get(site)
    if w is None:
        code, offset = site
        line = code.co_firstlineno
        for start, end, n in code.co_lines():
            if start <= offset < end:
                line = n if n is not None else line
                break
        if len(_SITES) >= 1 << 16:
            _SITES.clear()
        w = _SITES[site] = (code.co_filename, line, code.co_name)
    return w


def user_frames(limit: int = 8):
    """The user's Python frames, innermost first, as (filename, lineno, function)."""
    out = []
    f = _getframe(1)
    while f is not None and len(out) < limit:
        if not _is_internal(f.f_code):
            out.append((f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
        f = f.f_back
    return out


def fmt_where(w) -> str:
    if not w:
        return "<unknown>"
    return f"{os.path.basename(w[0])}:{w[1]}"
