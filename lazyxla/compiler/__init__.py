"""Caches and compilation (stages 5 and 9 of the flow: ... hash -> **cache** -> lower ->
**compile** -> execute): a program found by its key, or made.

Holds ``cache`` (the in-memory LRU of compiled programs, R6), ``persistent_cache`` (compiled
programs on disk, R7: the process-wide cache, the directory store, the entry format, the HMAC
key) and ``compile`` (a graph rolled (``rolling``), lowered (``lowering.build_program``) and
compiled through ``jax.jit``; parameter wrapping (R11), XLA's options per program, HLO text,
the workspace of a rolled program's loops).

May import: ``rolling``, ``run`` (``execution``: the compiled program's calls), ``lowering``,
``ir``, ``xla`` and the shared modules.
"""
