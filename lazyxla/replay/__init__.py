"""Capture and replay (beyond torch_xla, on top of the optimizers): a step recorded and planned
once, then run again and again without tracing an op (R16).

Holds ``capture`` (a step recorded and its program planned as a sync would, nothing run, every
tensor given its value back), ``binding`` (where each program input comes from at a replay,
what is frozen, the checks of every replay, the run and its outputs), ``graphs`` (``Graph``,
``graph``, ``make_graphed_callables``, ``ReplayedStep``: PyTorch's CUDA Graphs names) and
``compiled_step`` (``lazyxla.compile`` and ``lazyxla.step``: one program per step, ``full_graph``'s
read guard, ``replay=True``).

May import: ``optim`` (step counts a capture gives buffers of their own), ``frontend``,
``debug`` (explaining a key that changed), ``engine``, ``run``, ``ir``, ``xla`` and the
shared modules.
"""
