"""Rolling's settings, read when a graph is rolled (so a test or a benchmark may change them):
``LAZYXLA_ROLL_LAYERS=0`` turns rolling off; ``LAZYXLA_ROLL_MIN`` is the fewest iterations a
loop must hold (``MIN_ITERATIONS``, default 20); ``LAZYXLA_ROLL_MIN_WORK`` the fewest estimated
floating-point operations an iteration must do (``min_work``: ``MIN_WORK``'s row for the
platform, ``work``). The rest are the search's limits.

Touches nothing.
"""
from __future__ import annotations

from ..config import env_flag, env_int, env_str


ENABLED = env_flag("LAZYXLA_ROLL_LAYERS", True)
MIN_ITERATIONS = env_int("LAZYXLA_ROLL_MIN", 20)
MIN_BODY = 4
# the fewest estimated operations an iteration must do for its loop to be worth its cost per
# iteration (``work``), by platform. XLA:CPU: ~13 us per iteration measured, so a body of 4
# MFLOP (~100-300 us on 2 cores) pays it back tenfold; a 32-layer MLP of width 64 (0.1-0.3
# MFLOP an iteration) stays unrolled, a 128-wide GPT-2 layer on 32 tokens (13 MFLOP forward)
# rolls. TPU and GPU: not measured, so no floor (every loop of ``MIN_ITERATIONS`` rolls, as before).
MIN_WORK = {"cpu": 4_000_000, "tpu": 0, "gpu": 0}
WORK = env_str("LAZYXLA_ROLL_MIN_WORK", "")  # a number: every platform's floor (0: none)
MAX_LOOPS = 4
ROUNDS = 3
CANDIDATES = 4  # other cuts of a loop tried, fewest crossing values first
WIDE = 8  # a user with more operands (a stack, the optimizer's step) is alike at every position
# a class of carries may miss this many iterations: the first and last layers' copies are used
# otherwise within ``ROUNDS`` (the embedding, the final norm) and hash apart; finding the
# iterations adds them back, and the loop must still hold ``MIN_ITERATIONS``
EDGES = 2


def min_work(platform: str) -> int:
    """The floor of an iteration's estimated operations on ``platform`` (``MIN_WORK``, or
    ``LAZYXLA_ROLL_MIN_WORK`` when set)."""
    if WORK:
        try:
            return int(float(WORK))
        except ValueError:
            raise ValueError(f"LAZYXLA_ROLL_MIN_WORK={WORK!r}: a number of operations an iteration must do "
                             f"for its layers to roll (e.g. 4e6; 0: no floor)") from None
    return MIN_WORK.get(platform, 0)
