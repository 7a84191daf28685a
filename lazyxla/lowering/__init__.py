"""Lowerings: ATen ops as JAX functions, and the program built from a post-order.

A lowering is ``fn(sig, *args, **kwargs)``: ``args``/``kwargs`` are the op call as PyTorch
made it, with every tensor (and every scalar that became device data) replaced by a JAX
value; ``sig`` is the node's ``OpSig`` (``sig.outs``: output metas from PyTorch's own
shape rules; ``sig.cdtype``: PyTorch's promoted dtype of the inputs). It returns one JAX
array or a tuple, one per output; results are cast to the output dtypes afterwards.
Random ops receive the step's seed (int64) as ``__seed__``.

Modules (imports run one way: families -> ``registry``; ``program`` -> ``registry``; this
file imports them all and defines nothing):
- ``registry``: LOWERINGS, RANDOM, STATIC_ARGS, ZERO_D_AS_VECTOR, DECOMPOSITIONS (PyTorch's
  table), ``register``, ``get``, ``is_random``, ``functional_of``.
- ``program``: ``lower_call``, ``lower_node``, ``build_program`` (handed to ``jax.jit`` by
  ``executor``) and the lowerings of dispatch's own nodes, ``lower_convert`` and
  ``lower_view_scatter``.
- families, each registering its lowerings on import: ``elementwise``, ``reduce``,
  ``shape``, ``indexing``, ``factory``, ``random``, ``nn``, ``more``; ``amp`` (the gradient scaler's ops,
  as decompositions).

The names above from ``registry`` and ``program`` are re-exported here: the rest of lazyxla
uses ``lowering.X``. May touch: nothing but the registries.
"""
from __future__ import annotations

from .registry import (DECOMPOSITIONS, LOWERINGS, RANDOM, STATIC_ARGS, ZERO_D_AS_VECTOR,  # noqa: F401
                       functional_of, get, is_random, register)
from .program import build_program, lower_call, lower_convert, lower_node, lower_view_scatter  # noqa: F401
from . import elementwise, reduce, matmul, shape, indexing, factory, random  # noqa: F401
from . import conv, pooling, resample, softmax, loss, layer_norm, embedding, activation  # noqa: F401
from . import distance, fft  # noqa: F401
from . import amp  # noqa: F401  (after PyTorch's table, which registry loads: the gradient scaler's ops)
