"""The key (stage 4 of the flow: ... sync -> **collect -> graph hash** -> cache -> ...): which
program a sync needs.

Holds ``collect`` (a ``Graph``: the roots' post-order, the program's parameters and the
parameter sequence) and ``graph_hash`` (the six merges of R3 as an ordered list of named
ingredients, folded into a 128-bit key, with the trace of every merge that explanations read).

May import: ``ir``, ``xla`` (the compile environment) and the shared modules (``hashing``).
"""
