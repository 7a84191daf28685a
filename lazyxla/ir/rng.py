"""The RNG seed graph (R8).

The seed is one device-data parameter. Each random op recorded in a step extends a chain
``seed' = 2531011 + 214013 * seed`` in IR and takes the new value, so a program depends on
how many random ops it has, never on the seed. Each sync advances the host seed
(``seed = 1012031 + seed * 7012063``, 64-bit wrap); ``manual_seed`` sets it (default 101).

May touch: its own state, and the device (to upload the seed).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from .node import Node, OpSig, Slot, TensorMeta, data_leaf
from ..xla.client import scalar_array

DEFAULT_SEED = 101
_M64 = (1 << 64) - 1
_seed = DEFAULT_SEED
_seed_ir = None
_META = TensorMeta((), torch.int64)


def _lower_next(sig, s):
    """The next seed of the chain, made a buffer of its own. XLA copies cheap scalar arithmetic
    into every kernel that reads it, so the k-th random op's kernel held the chain's first k
    steps and no two random ops compiled to the same kernel (XLA:CPU generates code for each
    distinct kernel: GPT-2's training step at depth 8 had 137 distinct random-bit kernels,
    now 19, and spent 1-2 s more in code generation). XLA never copies a sort into its
    readers: the seed is read from the sorted pair of itself, the same value."""
    nxt = 2531011 + 214013 * s
    return jax.lax.sort(jnp.stack([nxt, nxt]))[0]


_NEXT = OpSig("lazyxla::seed_next", None, _lower_next, ((Slot(0),), ()), (_META,))


def _as_int64(v):
    return v - (1 << 64) if v >= (1 << 63) else v


def next_seed():
    """The IR value of a fresh seed for one random op."""
    global _seed_ir
    _seed_ir = (Node(_NEXT, (current(),)), 0)
    return _seed_ir


def current():
    """The IR value the next random op's seed is drawn from (a captured region takes it as an
    input and hands back the value it left, ``set_current``)."""
    global _seed_ir
    if _seed_ir is None:
        _seed_ir = (data_leaf(scalar_array(_as_int64(_seed), torch.int64, wrap=True), _META), 0)
    return _seed_ir


def set_current(value):
    global _seed_ir
    _seed_ir = value


def pending() -> bool:
    """Whether random ops were recorded since the last step (the seed is pending IR)."""
    return _seed_ir is not None and _seed_ir[0].data is None


def mark_step():
    global _seed, _seed_ir
    _seed = (1012031 + _seed * 7012063) & _M64
    _seed_ir = None


def get_state():
    """The host seed as a CPU uint8 tensor (8 bytes, little-endian): what PyTorch's
    ``torch.<device>.get_rng_state()`` returns."""
    return torch.tensor(list(_seed.to_bytes(8, "little")), dtype=torch.uint8)


def set_state(state):
    """Restore a seed saved by ``get_state``."""
    manual_seed(int.from_bytes(bytes(torch.as_tensor(state, dtype=torch.uint8).tolist()), "little"))


def manual_seed(seed: int):
    global _seed, _seed_ir
    _seed = int(seed) & _M64
    _seed_ir = None
