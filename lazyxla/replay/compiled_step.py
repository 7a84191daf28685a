"""One program per step: ``lazyxla.compile(fn, full_graph=False, name=None)`` and ``lazyxla.step()``.

``compile(fn)`` wraps ``fn`` (also as ``@lazyxla.compile()`` or ``with lazyxla.compile():``)
the way torch_xla's ``torch_xla.compile`` does: on entry, eager mode is switched off for the
step and whatever was pending before it is synced on its own; on exit (also when the body
raised) the step's operations are synced as one program and eager mode is restored.
``step()`` is ``compile()`` as a context manager.

With ``full_graph=True`` the step must be one program: a value read inside it that would run
a program (``print``, ``.item()``, ``.cpu()``, ``bool(t)``, a CPU fallback op ...) raises
``LazyXlaError`` at the user's line, naming the read, before anything runs (a guard checked
inside ``executor.read_values``, in the thread that entered the step). Reading a tensor that
is already device data runs nothing and is allowed. ``name`` names the step in that message.

``compile(fn, replay=True)`` captures the step once and replays its program (``replay``).

May touch: eager mode's switch and the executor's read guard, for the step's duration.
"""
from __future__ import annotations

import functools
import threading

from ..engine import eager, executor
from ..config import env_int
from ..errors import LazyXlaError
from ..ir.user_line import fmt_where, user_frame
from .graphs import ReplayedStep


class _Step:
    """The context (and decorator) behind ``compile`` and ``step``."""

    def __init__(self, full_graph: bool = False, name: str | None = None):
        self.full_graph = bool(full_graph)
        self.name = name
        self._saved = []

    def _refuse(self):
        if threading.get_ident() != self._thread:
            return
        where = user_frame(2)
        step = f" {self.name!r}" if self.name else ""
        raise LazyXlaError(
            f"lazyxla.compile(full_graph=True): step{step} reads a value at {fmt_where(where)}: {executor.describe_read()}; "
            f"that would run a program inside a step that must be one program. Read it after the step, or "
            f"look at it in lazyxla.add_step_closure(fn, args), which runs after the step's program")

    def __enter__(self):
        was_eager = eager.ON
        eager.ON = False
        try:
            executor.sync()  # what was pending before the step is not part of it
        except BaseException:
            eager.ON = was_eager
            raise
        self._thread = threading.get_ident()
        old_guard = executor.set_read_guard(self._refuse) if self.full_graph else None
        self._saved.append((was_eager, old_guard))
        return self

    def __exit__(self, exc_type, exc, tb):
        was_eager, old_guard = self._saved.pop()
        if self.full_graph:
            executor.set_read_guard(old_guard)
        try:
            executor.sync()
        finally:
            eager.ON = was_eager
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def stepped(*args, **kwargs):
            with _Step(self.full_graph, self.name or getattr(fn, "__name__", None)):
                return fn(*args, **kwargs)
        return stepped


# LAZYXLA_REPLAY_CHECK_EVERY=N: a replayed step traces and checks every N-th replay (read once)
CHECK_EVERY = env_int("LAZYXLA_REPLAY_CHECK_EVERY", 0)


def compile(fn=None, full_graph: bool = False, name: str | None = None, replay: bool = False,  # noqa: A001
            check_every: int | None = None, warmup: int = 1):
    """``fn`` wrapped so that each call is one step (synced before and after, one program);
    without ``fn``, a context manager and decorator doing the same. ``full_graph=True``: a value
    read inside the step raises ``LazyXlaError`` at the user's line instead of running a program.

    ``replay=True`` (a wrapper or decorator only): the step is captured once and its program
    replayed with each call's arguments (``replay.ReplayedStep``): each new argument signature
    runs lazily for ``warmup`` calls first (state the step makes on its first call, as an
    optimizer's, appears), then is captured; the first replays are traced again and checked,
    then every ``check_every``-th (default ``LAZYXLA_REPLAY_CHECK_EVERY``, 0: no more)."""
    every = CHECK_EVERY if check_every is None else int(check_every)
    if replay:
        def replayed(f):
            step_name = name or getattr(f, "__name__", None)
            return ReplayedStep(f, _Step(full_graph, step_name)(f), step_name, check_every=every, warmup=warmup)
        return replayed if fn is None else replayed(fn)
    if fn is None:
        return _Step(full_graph, name)
    return _Step(full_graph, name or getattr(fn, "__name__", None))(fn)


def step():
    """``with lazyxla.step(): ...``: the body is one step, synced before and after."""
    return _Step()
