"""XLA through JAX (the floor under every stage): the devices, transfers, dtypes, the compile
environment, and every use of JAX's private API.

Holds ``client`` (JAX's devices, SPMD and the process mesh, uploads and downloads, torch <-> JAX
dtypes, the compile environment folded into every key, R3.2), ``precision`` (what a float32
product computes at), ``widths`` (the bits an int64 is held in, by platform) and ``jax_internals`` (each
private JAX API lazyxla uses, checked against the pinned JAX version: a change is an error
naming it).

May import: the shared modules (``config``, ``metrics``) and JAX; nothing of the stages above.
"""
