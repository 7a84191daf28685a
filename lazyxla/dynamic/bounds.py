"""Which bound a dynamic size runs at: the bucket policy, ``mark_dynamic``'s marks, and the rent
a size pays in a larger bound's program until its own is compiled.

Bounds: ``LAZYXLA_DYNAMIC_BUCKETS``: unset or ``auto`` (a program is compiled for the next power
of two, at least 8; a size's own bound is a quarter-octave step, ``own_bound``), ``pow2`` (powers
of two only), a list ``16,32,64`` (the smallest listed that holds the size; beyond it powers of
two), or ``off`` (one program per shape, as torch_xla). ``mark``
(``lazyxla.mark_dynamic(t, dim, max=)``) sets one input dimension's bound. A size whose own
bound has no program runs in the smallest compiled program of larger bounds until its padding
there has cost about a compile (``Rent``); one that no program holds compiles ``bucket``.

May touch: the marks, and a family's programs and rents (``bounds_for``).
"""
from __future__ import annotations

import weakref

from .. import metrics
from ..config import env_str
from .messages import tell


def _policy():
    text = env_str("LAZYXLA_DYNAMIC_BUCKETS", "auto").strip().lower()
    if text in ("off", "0", "false", "no", "none"):
        return None
    if text in ("", "auto", "1", "on", "true"):
        return "auto"
    if text == "pow2":
        return "pow2"
    try:
        return tuple(sorted(int(x) for x in text.split(",") if x.strip()))
    except ValueError:
        raise ValueError(f"LAZYXLA_DYNAMIC_BUCKETS={text!r}: expected auto, pow2, off, "
                         "or sizes like 16,32,64") from None


POLICY = _policy()
STEPS = (1.25, 1.5, 1.75, 2.0)  # ``auto``: a size's own bound within its octave (at most 1.25x the size)


def enabled() -> bool:
    return POLICY is not None


def bucket(size: int, mark=None) -> int:
    """The bound a new program is compiled for: ``mark`` (mark_dynamic's max), else the smallest
    listed bucket that holds the size, else the next power of two (at least 8)."""
    if mark is not None:
        return mark
    if type(POLICY) is tuple:
        for b in POLICY:
            if b >= size:
                return b
    b = 8
    while b < size:
        b *= 2
    return b


def own_bound(size: int, mark=None) -> int:
    """A size's own bound: ``bucket``, except under ``auto``, where it is the smallest of a
    quarter-octave ladder (8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ...) that holds the size, so
    its padding is at most a quarter of the work. A size runs in its own bound's program once
    that is compiled; until then in a larger bound's (``Rent``)."""
    b = bucket(size, mark)
    if mark is not None or POLICY != "auto" or b == 8:
        return b
    return next(int(b // 2 * f) for f in STEPS if b // 2 * f >= size)


# ---------------------------------------------------------------------------------------
# mark_dynamic: an input dimension's bound, said up front.
MARKS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # storage -> {dim: max}


def mark(storage, shape, dim: int, max: int = None) -> None:  # noqa: A002 - torch's name
    """``lazyxla.mark_dynamic``: dimension ``dim`` of a tensor of ``shape`` whose value is
    ``storage`` is dynamic with bound ``max`` (default: its size's bucket)."""
    d = dim + len(shape) if dim < 0 else dim
    if not 0 <= d < len(shape):
        raise IndexError(f"lazyxla.mark_dynamic: dimension {dim} out of range for a tensor of shape {list(shape)}")
    size = shape[d]
    bound = bucket(size) if max is None else int(max)
    if size > bound:
        raise ValueError(f"lazyxla.mark_dynamic: dimension {d} has size {size}, above max={bound}")
    MARKS.setdefault(storage, {})[d] = bound


def mark_of(leaf, dim):
    ref = leaf.owner
    st = ref() if ref is not None else None
    marks = MARKS.get(st) if st is not None else None
    return marks.get(dim) if marks else None


# ---------------------------------------------------------------------------------------
# Which bound's program a size runs in: its own bound's, or (rent) a larger one already compiled.
# Ski rental: a size whose own bound has no program yet runs in the smallest compiled program
# whose bounds hold it, and each of those runs pays the padding it adds (the larger program's
# measured execute time times the share of its work that is padding for this size). When what
# was paid reaches the larger program's compile time, the size's own bound is compiled. So the
# padding never costs more than about one compile, and a size seen a few times costs none.
UNKNOWN_COMPILE_S = 1.0  # a program loaded from the persistent cache: its compile time not measured


class Cost:
    """One padded program of a family: its compile seconds, its latest run's execute seconds."""
    __slots__ = ("compile_s", "last", "exec_s")

    def __init__(self, compile_s):
        self.compile_s = compile_s or UNKNOWN_COMPILE_S
        self.last = None    # the latest run's execution.Completion
        self.exec_s = None  # the latest known execute seconds

    def run_s(self):
        c = self.last
        if c is not None and c.seconds is not None:
            self.exec_s = c.seconds
        return self.exec_s


class Rent:
    """Bounds ``own`` without a program, running in the program of the larger bounds ``host``:
    the seconds of padding paid so far, and the runs."""
    __slots__ = ("own", "host", "paid", "runs", "share", "label")

    def __init__(self, own, host, label):
        self.own, self.host, self.label = own, host, label
        self.paid, self.runs = 0.0, 0
        volume = 1
        for a, b in zip(own, host):
            volume *= a / b
        self.share = 1.0 - volume  # of the host program's work, the padding beyond ``own``

    def due(self, fam) -> bool:
        """Whether ``own`` should now get its own program: it has one already, or the padding
        paid reached the host program's compile time."""
        host = fam.programs.get(self.host)
        return self.own in fam.programs or (host is not None and self.paid >= host.compile_s)


def bounds_for(fam, own, sizes, marks):
    """The bounds a graph whose sizes' own bounds are ``own`` runs at, and its Rent (or None):
    ``own`` when compiled (or due); else the smallest compiled program that holds it, paying
    rent; else a new program at ``bucket`` (which ``own`` then rents, when smaller)."""
    if own in fam.programs:
        return own, None
    rent = fam.rents.get(own)
    if rent is not None:
        if not rent.due(fam):
            return rent.host, rent
        del fam.rents[own]
        tell("own", rent.label, own, rent.host, rent.runs, rent.paid)
        return own, None
    hosts = [b for b in fam.programs if len(b) == len(own) and all(x >= y for x, y in zip(b, own))]
    host = min(hosts, key=lambda b: (_volume(b), b)) if hosts else tuple(bucket(s, m) for s, m in zip(sizes, marks))
    if host == own:
        return own, None
    label = "; ".join(f"{v.label}: size {s}" for v, s in zip(fam.vars, sizes))
    rent = fam.rents[own] = Rent(own, host, label)
    if hosts:
        metrics.counter_inc("DynamicShapeBoundRent")
        tell("rent", label, own, host, fam.programs[host].compile_s)
    return host, rent


def _volume(bounds):
    v = 1
    for b in bounds:
        v *= b
    return v
