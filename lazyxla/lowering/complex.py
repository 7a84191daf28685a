"""Complex numbers: building them (``complex``, ``polar``) and viewing them as pairs of reals
(``view_as_real``, ``view_as_complex``), as JAX functions. Without these, PyTorch's
decomposition of ``complex`` writes through ``view_as_real``, which only a view on the device
can carry. Touches only the registry.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ..xla.client import jnp_dtype
from .registry import register


@register("complex.default")
def _complex(sig, real, imag):
    dt = jnp.finfo(jnp_dtype(sig.outs[0].dtype)).dtype  # the real dtype of the complex result
    return lax.complex(*jnp.broadcast_arrays(real.astype(dt), imag.astype(dt)))


@register("polar.default")
def _polar(sig, abs_, angle):
    dt = jnp.finfo(jnp_dtype(sig.outs[0].dtype)).dtype
    a, t = jnp.broadcast_arrays(abs_.astype(dt), angle.astype(dt))
    return lax.complex(a * jnp.cos(t), a * jnp.sin(t))


@register("view_as_real.default", "view_as_real_copy.default")
def _view_as_real(sig, x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@register("view_as_complex.default", "view_as_complex_copy.default")
def _view_as_complex(sig, x):
    if x.dtype == jnp.float16:  # complex32 is held as complex64 (``xla.TORCH_TO_JNP``)
        x = x.astype(jnp.float32)
    return lax.complex(x[..., 0], x[..., 1])
