"""What the dynamic-shapes stage tells the recompile log and ``PT_XLA_DEBUG_LEVEL``: one line per
decision (``describe``), sent to the ``events.DYNAMIC`` subscribers (``tell``).

Touches nothing but its subscribers.
"""
from __future__ import annotations

from .. import events


def describe(kind, *info) -> str:
    """One line for a ``dynamic`` event (the recompile log, ``PT_XLA_DEBUG_LEVEL``)."""
    if kind == "dimension":
        label, size, bound = info
        return (f"{label} is dynamic from now on (its size changed and every other change follows it): "
                f"size {size}, padded to {bound}; every size up to {bound} runs one program")
    if kind == "bound":
        label, size, bound, old = info
        return f"the bound of {label} grows from {old} to {bound} (size {size}): one more padded program"
    if kind == "rent":
        label, own, host, compile_s = info
        return (f"{label}: its bound {_fmt(own)} has no program yet, so it runs in the program of bound "
                f"{_fmt(host)} until the padding that adds has cost about that program's compile ({compile_s:.1f} s)")
    if kind == "own":
        label, own, host, runs, paid = info
        return (f"{label}: bound {_fmt(own)} gets its own program now: {runs} run(s) in the program of bound "
                f"{_fmt(host)} paid {paid:.2f} s of padding")
    return f"shapes stay exact for this graph, whose sizes vary: {info[0]}"


def _fmt(bounds):
    return ", ".join(map(str, bounds))


def tell(kind, *info):
    for hook in events.DYNAMIC:
        hook(kind, *info)
