"""The IR (stage 2 of the flow: torch op -> **IR node** -> sync -> ...): what the front end
records instead of running an op, and what every later stage reads.

Holds ``node`` (``Node``, ``OpSig``, ``TensorMeta``, ``Slot``: a recorded op, its signature and
its 128-bit hash, fixed when the node is made (R1.3, R1.4); ``post_order``, ``skeleton``),
``user_line`` (the user's Python line a node was recorded at, taken cheaply and resolved when
read) and ``rng`` (the random seed as a small graph of its own, R8).

May import: ``lazyxla.xla`` and the shared modules (``hashing``, ``config``, ``metrics``).
Every stage above imports it; it imports no stage.
"""
