"""Rolling's settings, read when a graph is rolled (so a test or a benchmark may change them):
``LAZYXLA_ROLL_LAYERS=0`` turns rolling off; ``LAZYXLA_ROLL_MIN`` is the fewest iterations a
loop must hold (``MIN_ITERATIONS``, default 20). The rest are the search's limits.

Touches nothing.
"""
from __future__ import annotations

from ..config import env_flag, env_int


ENABLED = env_flag("LAZYXLA_ROLL_LAYERS", True)
MIN_ITERATIONS = env_int("LAZYXLA_ROLL_MIN", 20)
MIN_BODY = 4
MAX_LOOPS = 4
ROUNDS = 3
CANDIDATES = 4  # other cuts of a loop tried, fewest crossing values first
WIDE = 8  # a user with more operands (a stack, the optimizer's step) is alike at every position
# a class of carries may miss this many iterations: the first and last layers' copies are used
# otherwise within ``ROUNDS`` (the embedding, the final norm) and hash apart; finding the
# iterations adds them back, and the loop must still hold ``MIN_ITERATIONS``
EDGES = 2
