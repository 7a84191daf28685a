"""``F.scaled_dot_product_attention`` on the lazy device: one node forward, one backward.

PyTorch's SDPA is a composite: on a device without a fused kernel it decomposes into its math
path (float32 upcasts of half-precision inputs, the scores and probabilities materialized, a
safe-softmax pass), which every model's attention then records op by op. ``kernels`` gives
the op this kernel for the lazy device's autograd key (``ONE_NODE``): where lazyxla's attention
(``lowering.attention``) computes exactly what was asked, it records ``lazyxla::attention``,
whose gradient (``register_autograd``) records ``lazyxla::attention_backward``; anything else
(dropout, a mask that needs a gradient, an input PyTorch refuses) takes PyTorch's own
decomposition, so its numbers and its errors are eager's. ``LAZYXLA_FUSED_ATTENTION=0`` leaves
every call to the decomposition.

May touch: nothing (``kernels`` registers ``kernel``, ``backward`` and ``setup``).
"""
from __future__ import annotations

import math

import torch

from ..config import env_flag
from ..lowering.attention import ATTENTION, ATTENTION_BACKWARD

ENABLED = env_flag("LAZYXLA_FUSED_ATTENTION", True)
OP, ATEN = "lazyxla::attention", "scaled_dot_product_attention"  # the node, and the op it takes over
_SDPA = torch.ops.aten.scaled_dot_product_attention.default


def _supported(q, k, v, mask, dropout_p, is_causal, enable_gqa) -> bool:
    """Whether lazyxla's attention computes this call as PyTorch's math path would: no dropout
    that draws, no mask with a gradient, a mask beside ``is_causal`` refused by PyTorch, and the
    shapes PyTorch accepts (checked again by PyTorch's own path, which raises its errors)."""
    if not ENABLED or dropout_p > 0.0:
        return False
    if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim() or not (q.dtype == k.dtype == v.dtype):
        return False
    if not q.dtype.is_floating_point or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        return False
    if mask is not None and (is_causal or mask.requires_grad or mask.dim() > q.dim()):
        return False
    if q.dim() >= 3:
        hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
        if enable_gqa:
            if hk != hv or hk == 0 or hq % hk:
                return False
        elif not (hq == hk == hv):
            return False
        if q.shape[:-3] != k.shape[:-3] or k.shape[:-3] != v.shape[:-3]:
            return False
    elif enable_gqa:
        return False
    return True


def kernel(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    if not _supported(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
        return _SDPA.decompose(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                               enable_gqa=enable_gqa)
    s = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    out, _ = ATTENTION(query, key, value, attn_mask, bool(is_causal), s, bool(enable_gqa))
    return out


def setup(ctx, inputs, output):
    q, k, v, mask, is_causal, scale, enable_gqa = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, mask, out, lse)
    ctx.args = (is_causal, scale, enable_gqa)


def backward(ctx, grad_out, grad_lse):
    q, k, v, mask, out, lse = ctx.saved_tensors
    is_causal, scale, enable_gqa = ctx.args
    dq, dk, dv = ATTENTION_BACKWARD(grad_out.contiguous(), q, k, v, mask, out, lse, is_causal, scale, enable_gqa)
    return dq, dk, dv, None, None, None, None
