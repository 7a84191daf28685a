"""Matrix products as JAX functions: mm, bmm, mv, dot/vdot, addmm/baddbmm/addmv/addbmm
and ``_trilinear`` (``nn.Bilinear``).

Operands are cast to PyTorch's output dtype; float32 products compute at the matmul precision
(``xla.precision``: torch_xla's ``set_mat_mul_precision``; float32 itself on the CPU). Touches
only the registry.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..xla import precision
from ..xla.client import jnp_dtype
from .registry import register

HI = precision.of("matmul")  # None: the program is traced at the setting


def _mmdt(sig, *xs):
    """The operands in PyTorch's output dtype."""
    dt = jnp_dtype(sig.outs[0].dtype)
    return [x.astype(dt) if x.dtype != dt else x for x in xs]


@register("mm.default", "bmm.default", "mv.default", "dot.default")
def _mm(sig, a, b):
    a, b = _mmdt(sig, a, b)
    return jnp.matmul(a, b, precision=HI)


@register("_trilinear.default")  # nn.Bilinear: the three operands unsqueezed, multiplied, summed
def _trilinear(sig, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    i1, i2, i3 = _mmdt(sig, i1, i2, i3)
    xs = []
    for x, expand in ((i1, expand1), (i2, expand2), (i3, expand3)):
        for d in sorted(expand):
            x = jnp.expand_dims(x, d)
        xs.append(x)
    return jnp.sum(xs[0] * xs[1] * xs[2], axis=tuple(sumdim))


@register("vdot.default")
def _vdot(sig, a, b):
    a, b = _mmdt(sig, a, b)
    return jnp.vdot(a, b, precision=HI)  # the first operand conjugated (a no-op for real ones)


def _scaled(x, s):
    if isinstance(s, (int, float)) and s == 1:
        return x
    return x * (s.astype(x.dtype) if hasattr(s, "astype") else s)


def _opmath(x):
    """PyTorch's CPU kernels add a half-precision product to its bias in float32 and round
    once: the product is kept in float32 (rounding it first can lose all of a cancelling sum)."""
    return jnp.float32 if x.dtype in (jnp.float16, jnp.bfloat16) else None


@register("addmm.default", "baddbmm.default", "addmv.default")
def _add_product(sig, bias, a, b, beta=1, alpha=1):
    """beta * bias + alpha * (a @ b); with beta == 0 the bias is ignored (NaNs too), as in PyTorch."""
    bias, a, b = _mmdt(sig, bias, a, b)
    acc = _opmath(a)
    prod = _scaled(jnp.matmul(a, b, precision=HI, preferred_element_type=acc), alpha)
    if isinstance(beta, (int, float)) and beta == 0:
        return prod
    return _scaled(bias if acc is None else bias.astype(acc), beta) + prod


@register("addbmm.default")
def _addbmm(sig, bias, a, b, beta=1, alpha=1):
    """beta * bias + alpha * (the sum over the batch of a[i] @ b[i]); beta == 0 ignores the bias."""
    bias, a, b = _mmdt(sig, bias, a, b)
    acc = _opmath(a)
    prod = _scaled(jnp.einsum("bij,bjk->ik", a, b, precision=HI, preferred_element_type=acc), alpha)
    if isinstance(beta, (int, float)) and beta == 0:
        return prod
    return _scaled(bias if acc is None else bias.astype(acc), beta) + prod
