"""``lazyxla.backends``: torch_xla's ``torch_xla.backends``, the settings of the XLA backend.

``set_mat_mul_precision('default' | 'high' | 'highest')`` sets what a float32 matrix product
(``mm``, ``matmul``, ``linear``, convolutions, attention) computes at in programs compiled from
then on, and ``get_mat_mul_precision()`` reads it; the default is ``'default'``, as torch_xla's.
On a TPU, ``default`` is one bfloat16 pass of the matrix unit, ``high`` three, ``highest`` six
(about float32); on a GPU, ``default`` and ``high`` allow TF32; XLA:CPU computes float32 at
every setting. The setting is part of every program's key, so changing it compiles anew and
never runs a program compiled at another. Products inside algorithms (factorizations,
solves, special functions) and weight matrices (average pooling, interpolation) compute at
``highest`` at every setting (``lazyxla.xla.precision.RULES``). PyTorch's own
``torch.set_float32_matmul_precision`` is not read, as torch_xla does not read it.
"""
from __future__ import annotations

from .xla.precision import get_mat_mul_precision, set_mat_mul_precision  # noqa: F401

__all__ = ["set_mat_mul_precision", "get_mat_mul_precision"]
