"""Lowering (stage 8 of the flow: ... cache -> **lower** -> compile -> execute): ATen ops as JAX
functions, and the program built from a post-order. A library every stage below the engine
calls: ``compiler`` lowers programs with it, ``run`` the writes through views, ``rolling`` reads
its schema facts; it imports only ``ir``, ``xla`` and the shared modules.

A lowering is ``fn(sig, *args, **kwargs)``: ``args``/``kwargs`` are the op call as PyTorch
made it, with every tensor (and every scalar that became device data) replaced by a JAX
value; ``sig`` is the node's ``OpSig`` (``sig.outs``: output metas from PyTorch's own
shape rules; ``sig.cdtype``: PyTorch's promoted dtype of the inputs). It returns one JAX
array or a tuple, one per output; results are cast to the output dtypes afterwards.
Random ops receive the step's seed (int64) as ``__seed__``.

Modules. Imports run one way: the families and ``program`` import ``registry`` (several
families also ``nn_helpers``), never this file, which imports them all and defines nothing
itself; outside the package, lowering imports only ``lazyxla.ir`` and ``lazyxla.xla``,
which never import it.
- ``registry``: the registries LOWERINGS, RANDOM, STATIC_ARGS, ZERO_D_AS_VECTOR,
  SHAPE_RULES (output shapes of ops PyTorch has no meta kernel for), OUTPUT_DTYPES (the CPU
  kernel's output dtypes where the meta kernel's differ) and DECOMPOSITIONS
  (PyTorch's decomposition table, loaded on import); ``register``, ``shape_rule``, ``get``,
  ``is_random``, ``is_view``, ``functional_of``.
- ``program``: ``lower_call``, ``lower_node``, ``build_program`` (the function ``executor``
  hands to ``jax.jit``) and the lowerings of lazyxla's own nodes (writes through views, conversions), ``lower_convert`` and
  ``lower_view_scatter``.
- families, each registering its lowerings on import:
  ``elementwise`` (unary, binary, comparisons, where/clamp/fill), ``reduce`` (reductions,
  scans, sort, top-k), ``matmul`` (matrix products), ``shape`` (views, writes through them,
  cat/stack/flip/pad), ``indexing`` (gather, scatter, index_put, masked_scatter,
  scatter_reduce), ``factory`` (zeros, full, arange, eye, ...), ``random`` (seeded random
  ops, dropout); neural-network ops with their backward: ``conv``, ``pooling``,
  ``resample`` (upsampling), ``softmax``, ``loss``, ``layer_norm``, ``embedding`` (and
  embedding bags), ``activation``; ``distance`` (cdist, pdist), ``fft`` (real <-> complex);
  ``special`` (special functions: Bessel, zeta/polygamma, igamma, the orthogonal polynomials);
  ``complex`` (complex, polar, view_as_real/complex); ``tpu_kernels`` (Pallas kernels for the
  TPU and the table of the lowerings they replace); ``attention`` (lazyxla's own
  ``lazyxla::attention`` and its backward: scaled dot-product attention as one node each);
  ``linalg`` (factorizations, solves, inverses, determinants, SVD, eigendecompositions);
  ``selection`` (kthvalue, median, nanmedian, mode: order statistics with PyTorch's CPU tie rules);
  ``histogram`` (histogram and histogramdd, with their shape rules);
  ``amp`` (the gradient scaler's two ops, as decompositions: imported after the table).
- ``nn_helpers``: helpers the neural-network families share (no lowerings).
- ``collective``: the cross-process collectives lazyxla records (``lower_all_reduce``,
  ``lower_all_gather``, ``lower_reduce_scatter``, ``lower_broadcast``) over the process axis ``PROCESS_AXIS``.

Public names, re-exported from ``registry`` and ``program`` (the rest of lazyxla uses
``lowering.X``): LOWERINGS, DECOMPOSITIONS, STATIC_ARGS, RANDOM, ZERO_D_AS_VECTOR,
SHAPE_RULES, OUTPUT_DTYPES, register, shape_rule, get, is_random, is_view, functional_of, lower_call, lower_node, build_program,
lower_convert, lower_view_scatter, lower_sharding, the collectives' lowerings, lower_fused_adam, lower_fused_sgd,
lower_batch_norm_train. May touch: nothing but the registries.
"""
from __future__ import annotations

from .registry import (DECOMPOSITIONS, LOWERINGS, OUTPUT_DTYPES, RANDOM, SHAPE_RULES, STATIC_ARGS,  # noqa: F401
                       ZERO_D_AS_VECTOR,
                       functional_of, get, is_random, is_view, register, shape_rule)
from .program import build_program, row_args, lower_call, lower_convert, lower_node, lower_sharding, lower_view_scatter  # noqa: F401
from .collective import (PROCESS_AXIS, lower_all_gather, lower_all_reduce, lower_broadcast,  # noqa: F401
                         lower_reduce_scatter)
from . import elementwise, reduce, matmul, shape, indexing, factory, random  # noqa: F401
from . import conv, pooling, resample, softmax, loss, layer_norm, embedding, activation  # noqa: F401
from . import distance, fft, linalg  # noqa: F401
from . import selection  # noqa: F401
from . import histogram  # noqa: F401
from . import complex  # noqa: F401
from . import special  # noqa: F401
from . import attention  # noqa: F401  (lazyxla::attention and its backward: SDPA as one node)
from . import cross_entropy  # noqa: F401  (lazyxla::cross_entropy and its backward: F.cross_entropy as one node)
from . import tpu_kernels  # noqa: F401  (Pallas kernels that replace lowerings on a TPU, by its RULES)
from . import batch_norm  # noqa: F401  (after PyTorch's table: eval returns empty saved statistics)
from . import amp  # noqa: F401  (after PyTorch's table, which registry loads: the gradient scaler's ops)
from .optim import lower_fused_adam, lower_fused_sgd  # noqa: F401  (the fused Adam, AdamW, SGD steps)
from .batch_norm import lower_batch_norm_train  # noqa: F401  (running_stats' node)
