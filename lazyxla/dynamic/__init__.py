"""Dynamic dimensions (R17), on a cache miss between the graph hash and the compile: which
input sizes vary, the bounds they run at, and the padded twin of a bound.

Holds ``structure`` (a graph without its integers; families of one structure and their size
variables: which integer follows which input dimension, ``a*s + b``), ``bounds`` (the bucket
policy, ``mark_dynamic``'s marks, the rent a size pays in a larger program), ``twin`` (the
graph rewritten at its bounds by ``lowering.padding``'s rules, and ``PaddedCall``, which runs it
as the exact graph), ``planner`` (``plan``, ``observe``, ``refuse``: the stage's entry from the
engine) and ``messages`` (what it tells the recompile log).

May import: ``run`` (which buffers the host sent), ``lowering`` (the padding rules), ``ir``,
``xla`` and the shared modules. Imported by ``engine`` (the lookup), ``debug`` and ``hf``.
Knows nothing about torch ops beyond the rule table.

The face below is what other stages call.
"""
from .bounds import bucket, enabled, mark, own_bound  # noqa: F401
from .messages import describe  # noqa: F401
from .planner import observe, plan, refuse  # noqa: F401
from .structure import reset  # noqa: F401
from .twin import PaddedCall, PaddedSig, Plan  # noqa: F401
