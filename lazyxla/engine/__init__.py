"""The engine (stage 3 of the flow: torch op -> IR node -> **sync / value read** -> collect -> hash
-> cache -> lower -> compile -> execute): it turns the pending IR into one program and runs it.

Holds ``executor`` (``sync`` (R4), a value read (R5), the lookup in memory and on disk, buffer
donation (R9), ``graph_key``, ``dump_hlo`` (R10); ``plan_pending`` and ``end_step``, which a
capture and a replay share (R16)), ``host_reads`` (a read over data the host just sent,
answered by PyTorch on the host: no program, R17.4), ``eager`` (eager mode: each op's pending IR
run at once) and ``closures`` (step closures, run after each sync's program).

May import: ``keys`` and ``dynamic`` (the key, the padded twin), ``compiler``, ``run``,
``lowering``, ``ir``, ``xla`` and the shared modules; it never calls back into the front end.
"""
