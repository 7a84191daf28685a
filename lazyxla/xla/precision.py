"""Matmul precision: what a float32 matrix product computes at, where that is a choice.

A TPU's matrix unit multiplies bfloat16: a float32 product there is one bfloat16 pass
(``default``), three (``high``: about float32's 16 leading bits) or six (``highest``: about
float32). GPUs have the same choice as TF32. XLA:CPU computes float32 at every setting. As
torch_xla (``torch_xla.backends.set_mat_mul_precision``), the setting is ``default`` unless set
(``lazyxla.backends.set_mat_mul_precision``), and it is part of every program's key: the
compile environment's merge folds it (``keys.graph_hash``), so a program compiled at one
setting is never run at another, in memory or from the persistent cache.

How it reaches the program: the compiler traces every program under JAX's
``default_matmul_precision`` at the setting (``scope``), so each product a lowering writes
without a precision of its own follows it. ``RULES`` says, per family of lowerings, whether it
follows the setting or keeps a precision of its own, and why; a lowering asks ``of(family)``
for the ``precision=`` argument to pass (None: the setting's).

Touches only the setting.
"""
from __future__ import annotations

import jax

SETTINGS = ("default", "high", "highest")  # torch_xla's names, which JAX's config also takes

# family -> (what it computes at, why)
RULES = {
    "matmul": ("setting", "mm, bmm, addmm, baddbmm, matmul, dot, vdot, linear: the user's own products"),
    "conv": ("setting", "convolutions and their gradients, as torch_xla's"),
    "attention": ("setting", "scaled_dot_product_attention's two products (lazyxla::attention)"),
    "linear_cross_entropy": ("setting", "F.linear_cross_entropy's logits"),
    "algorithm": ("highest", "products inside an algorithm: factorizations, solves, inverses and "
                             "decompositions, special functions' quadratures and series, CTC loss's path "
                             "counts; one bfloat16 pass would lose the digits the algorithm needs"),
    "weights": ("highest", "average pooling and interpolation written as a product with a matrix of "
                           "weights: at one bfloat16 pass the weights themselves (1/3, 0.25) would round"),
}

_setting = ["default"]


def set_mat_mul_precision(precision: str) -> None:
    """The precision of float32 products in programs compiled from now on: ``default``,
    ``high`` or ``highest``."""
    if precision not in SETTINGS:
        raise ValueError(f"set_mat_mul_precision: {precision!r} is not one of {', '.join(SETTINGS)}")
    _setting[0] = precision


def get_mat_mul_precision() -> str:
    return _setting[0]


def of(family: str):
    """The ``precision=`` a lowering of ``family`` passes to its products: None (the setting,
    which the program is traced under) or the fixed precision ``RULES`` gives the family."""
    return None if RULES[family][0] == "setting" else jax.lax.Precision.HIGHEST


def scope():
    """The program's products at the setting: JAX's ``default_matmul_precision`` while the
    compiler traces and lowers a program."""
    return jax.default_matmul_precision(_setting[0])
