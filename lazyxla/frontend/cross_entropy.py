"""``F.cross_entropy`` on the lazy device: one node forward, one backward.

PyTorch's ``cross_entropy_loss`` is a composite (``log_softmax``, then ``nll_loss``), whose
log-probabilities become a whole array of the logits' size in the program. ``kernels`` gives
the op this kernel for the lazy device's autograd key (``ONE_NODE``): where lazyxla's cross entropy
(``lowering.cross_entropy``) computes exactly what the composite does (float32 or float64
logits ``[N, C]``, class-index targets ``[N]``, no class weights, no label smoothing) it records
``lazyxla::cross_entropy``, whose gradient records ``lazyxla::cross_entropy_backward``; any other
call takes PyTorch's composite, so its numbers and its errors are eager's. Half-precision
logits take the composite too: PyTorch rounds their log-probabilities to the half type before
picking the target's (language models' losses upcast the logits to float32 first, HF's
``logits.float()``, and take the node). ``LAZYXLA_FUSED_CROSS_ENTROPY=0`` leaves every call to
the composite.

May touch: nothing (``kernels`` registers ``kernel``, ``backward`` and ``setup``).
"""
from __future__ import annotations

import torch

from ..config import env_flag
from ..lowering.cross_entropy import CROSS_ENTROPY, CROSS_ENTROPY_BACKWARD

ENABLED = env_flag("LAZYXLA_FUSED_CROSS_ENTROPY", True)
OP, ATEN = "lazyxla::cross_entropy", "cross_entropy_loss"  # the node, and the op it takes over
_CE = torch.ops.aten.cross_entropy_loss.default


def _supported(x, target, weight, label_smoothing) -> bool:
    return (ENABLED and weight is None and label_smoothing == 0.0 and x.dim() == 2 and target.dim() == 1
            and x.dtype in (torch.float32, torch.float64) and target.dtype == torch.int64
            and x.shape[0] == target.shape[0] and x.shape[0] > 0 and x.shape[1] > 0
            and x.device == target.device)


def kernel(x, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0):
    if not _supported(x, target, weight, label_smoothing):
        return _CE.decompose(x, target, weight, reduction, ignore_index, label_smoothing)
    loss, _, _ = CROSS_ENTROPY(x, target, int(reduction), ignore_index)
    return loss


def setup(ctx, inputs, output):
    x, target, reduction, ignore_index = inputs
    _, row_max, row_logsum = output
    ctx.save_for_backward(x, target, row_max, row_logsum)
    ctx.args = (reduction, ignore_index)


def backward(ctx, grad, grad_max, grad_logsum):
    x, target, row_max, row_logsum = ctx.saved_tensors
    reduction, ignore_index = ctx.args
    dx = CROSS_ENTROPY_BACKWARD(grad.contiguous(), x, target, row_max, row_logsum, reduction, ignore_index)
    return dx, None, None, None
