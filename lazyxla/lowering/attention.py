"""Attention as one node: ``lazyxla::attention`` and ``lazyxla::attention_backward``.

``F.scaled_dot_product_attention`` on the lazy device records these two ops of lazyxla's own
(``frontend.attention`` routes it here and gives it its gradient) instead of PyTorch's math
decomposition, which upcasts half-precision inputs to float32 and materializes the scores, the
probabilities and a safe-softmax pass over them in every layer. Written once here, attention
is what a JAX user writes: the scores ``q k^T * scale`` as one product in the inputs' dtype
(float32 accumulation, rounded once), the mask, a float32 softmax, the probabilities in the
values' dtype times ``v`` (float32 accumulation); XLA fuses it as it fuses a JAX step's
attention, and keeps no float32 scores between the forward and the backward. The backward
takes the scores the same way, so its probabilities are exactly the forward's. The forward also gives the
rows' log-sum-exp, from which the backward (flash attention's formulas: ``p = exp(s - lse)``,
``ds = p (dp - rowsum(dO o O))``) computes the three gradients without the forward's
probabilities.

PyTorch's rules kept: the causal mask is the lower triangle aligned at the top left
(``tril`` of L x S); a boolean mask says where to attend, a float one is added to the scores;
a row with nothing to attend gives zeros (``_safe_softmax``) and no gradient; ``enable_gqa``
repeats each key and value head for its group of query heads (the gradients sum over the
group). Both products compute at the matmul precision (``xla.precision``, family
``attention``).

On a TPU, where ``tpu_kernels``' rules let it, both are the Pallas splash attention kernel
instead (``LAZYXLA_TPU_KERNELS``); the forward's log-sum-exp is then not computed (its backward
is the kernel's own). Defines the two ops (``torch.library``: schema and shape function) and
registers their lowerings. Touches only the registry.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from ..xla import precision
from . import tpu_kernels
from .registry import register

_LIB = torch.library.Library("lazyxla", "DEF")
_LIB.define("attention(Tensor q, Tensor k, Tensor v, Tensor? mask, bool is_causal, float scale, bool enable_gqa) "
            "-> (Tensor, Tensor)")
_LIB.define("attention_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor? mask, Tensor out, Tensor lse, "
            "bool is_causal, float scale, bool enable_gqa) -> (Tensor, Tensor, Tensor)")
ATTENTION = torch.ops.lazyxla.attention.default
ATTENTION_BACKWARD = torch.ops.lazyxla.attention_backward.default


@torch.library.register_fake("lazyxla::attention")
def _attention_shapes(q, k, v, mask, is_causal, scale, enable_gqa):
    return (q.new_empty(q.shape[:-1] + v.shape[-1:]),
            q.new_empty(q.shape[:-1], dtype=torch.float32))


@torch.library.register_fake("lazyxla::attention_backward")
def _attention_backward_shapes(grad, q, k, v, mask, out, lse, is_causal, scale, enable_gqa):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _grouped(x, groups):
    """Keys or values repeated for each of ``groups`` query heads (``enable_gqa``; head dim -3)."""
    return x if groups == 1 else jnp.repeat(x, groups, axis=-3)


def _ungrouped(g, groups):
    """A gradient of repeated keys or values summed back over each head's group."""
    if groups == 1:
        return g
    shape = g.shape[:-3] + (g.shape[-3] // groups, groups) + g.shape[-2:]
    return jnp.sum(g.reshape(shape), axis=-3)


def _scores(q, k, mask, is_causal, scale):
    """The scores as the softmax reads them: ``q k^T`` in the inputs' dtype (float32
    accumulation, rounded once, as XLA's and JAX's attention compute them), scaled, in float32
    from there, the mask added; and where a position may be attended (None: everywhere). A
    masked score is float32's lowest (not -inf: no inf - inf in a row)."""
    s = jnp.einsum("...qd,...kd->...qk", q, k, precision=precision.of("attention")) * jnp.asarray(scale, q.dtype)
    s = s.astype(jnp.float32)
    keep = None
    if is_causal:
        L, S = s.shape[-2], s.shape[-1]
        keep = jnp.arange(S)[None, :] <= jnp.arange(L)[:, None]
    if mask is not None:
        if mask.dtype == jnp.bool_:
            keep = mask if keep is None else keep & mask
        else:
            add = mask.astype(jnp.float32)
            s = s + add
            finite = add > -jnp.inf  # a float mask's -inf masks, as in PyTorch
            keep = finite if keep is None else keep & finite
    if keep is not None:
        s = jnp.where(keep, s, jnp.finfo(jnp.float32).min)
    return s, keep


def _none_kept(keep, shape):
    """Rows with no position to attend (None when every row has one)."""
    if keep is None:
        return None
    return ~jnp.any(jnp.broadcast_to(keep, shape), axis=-1)


@register(ATTENTION)
def _attention(sig, q, k, v, mask, is_causal, scale, enable_gqa):
    groups = q.shape[-3] // k.shape[-3] if enable_gqa else 1
    k, v = _grouped(k, groups), _grouped(v, groups)
    if tpu_kernels.attention_fits(q, k, v, mask, is_causal):  # the TPU's splash attention (its backward too)
        return (tpu_kernels.attention(q, k, v, is_causal, scale).astype(q.dtype),
                jnp.zeros(q.shape[:-1], jnp.float32))
    s, keep = _scores(q, k, mask, is_causal, scale)
    m = jnp.max(s, axis=-1, keepdims=True)
    e = jnp.exp(s - m)
    total = jnp.sum(e, axis=-1, keepdims=True)
    p = e / total
    out = jnp.einsum("...qk,...kd->...qd", p.astype(v.dtype), v, precision=precision.of("attention"),
                     preferred_element_type=jnp.float32).astype(q.dtype)
    lse = jnp.log(total[..., 0]) + m[..., 0]
    empty = _none_kept(keep, s.shape) if mask is not None else None  # a causal mask alone keeps one per row
    if empty is not None:  # nothing to attend: zeros (_safe_softmax) and no gradient
        out = jnp.where(empty[..., None], jnp.zeros((), out.dtype), out)
        lse = jnp.where(empty, -jnp.inf, lse)
    return out, lse


@register(ATTENTION_BACKWARD)
def _attention_backward(sig, grad, q, k, v, mask, out, lse, is_causal, scale, enable_gqa):
    groups = q.shape[-3] // k.shape[-3] if enable_gqa else 1
    kg, vg = _grouped(k, groups), _grouped(v, groups)
    if tpu_kernels.attention_fits(q, kg, vg, mask, is_causal):  # as the forward did
        dq, dk, dv = tpu_kernels.attention_backward(grad, q, kg, vg, is_causal, scale)
        return (dq.astype(q.dtype), _ungrouped(dk.astype(jnp.float32), groups).astype(k.dtype),
                _ungrouped(dv.astype(jnp.float32), groups).astype(v.dtype))
    prec = precision.of("attention")
    s, _ = _scores(q, kg, mask, is_causal, scale)
    finite = jnp.isfinite(lse)[..., None]
    p = jnp.where(finite, jnp.exp(s - jnp.where(finite, lse[..., None], 0.0)), 0.0)  # masked: exp(lowest - lse) = 0
    f32 = jnp.float32
    dv = jnp.einsum("...qk,...qd->...kd", p.astype(grad.dtype), grad, precision=prec, preferred_element_type=f32)
    dp = jnp.einsum("...qd,...kd->...qk", grad, vg, precision=prec, preferred_element_type=f32)
    rows = jnp.sum(grad.astype(f32) * out.astype(f32), axis=-1, keepdims=True)
    ds = (p * (dp - rows)) * scale
    dq = jnp.einsum("...qk,...kd->...qd", ds.astype(q.dtype), kg, precision=prec, preferred_element_type=f32)
    dk = jnp.einsum("...qk,...qd->...kd", ds.astype(q.dtype), q, precision=prec, preferred_element_type=f32)
    return (dq.astype(q.dtype), _ungrouped(dk, groups).astype(k.dtype), _ungrouped(dv, groups).astype(v.dtype))
