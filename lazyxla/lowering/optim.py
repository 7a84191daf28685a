"""PyTorch's fused Adam and AdamW steps (``torch.optim.Adam/AdamW(fused=True)``, transformers'
default optimizer), recorded through ordinary tensor ops.

``_fused_adam_`` and ``_fused_adamw_`` update whole lists of parameters and their state in
place and have no PyTorch decomposition, so without this they would run on the CPU at every
step (a value read of every parameter). Written here with the update PyTorch's CPU kernel
computes, per parameter: the gradient unscaled by ``grad_scale`` (written back, as the kernel
does) and negated under ``maximize``; weight decay (AdamW: the parameter shrinks by
``lr * weight_decay``; Adam: added to the gradient); the moments (``lerp`` and the squared
gradient); the bias corrections from the step count, which the optimizer keeps on the device;
amsgrad's running maximum; and, when ``found_inf`` is given (a gradient scaler), nothing
changes if it is set. Registered as decompositions on import; touches nothing else.
"""
from __future__ import annotations

import torch

from .registry import DECOMPOSITIONS

aten = torch.ops.aten


def _fused_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
                weight_decay, eps, amsgrad, maximize, grad_scale, found_inf, decoupled):
    keep = None if found_inf is None else (found_inf == 0)
    for i, p in enumerate(params):
        g = grads[i]
        if grad_scale is not None:
            g = g / grad_scale.to(g.dtype)
            grads[i].copy_(g)
        if maximize:
            g = -g
        new_p = p
        if weight_decay != 0:
            if decoupled:
                new_p = p - (p * weight_decay) * lr
            else:
                g = g + p * weight_decay
        m = torch.lerp(exp_avgs[i], g, 1 - beta1)
        v = exp_avg_sqs[i] * beta2 + (g * g) * (1 - beta2)
        step = state_steps[i].to(torch.float32)
        bias1 = 1 - torch.pow(beta1, step)
        bias2_sqrt = torch.sqrt(1 - torch.pow(beta2, step))
        if amsgrad:
            vmax = torch.maximum(max_exp_avg_sqs[i], v)
            denom = torch.sqrt(vmax) / bias2_sqrt.to(v.dtype) + eps
        else:
            denom = torch.sqrt(v) / bias2_sqrt.to(v.dtype) + eps
        new_p = new_p - (lr / bias1).to(p.dtype) * m / denom
        pairs = [(p, new_p), (exp_avgs[i], m), (exp_avg_sqs[i], v)]
        if amsgrad:
            pairs.append((max_exp_avg_sqs[i], vmax))
        for dst, val in pairs:
            dst.copy_(val if keep is None else torch.where(keep, val, dst))


def _adam(decoupled):
    def fused(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
              weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
        _fused_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
                    weight_decay, eps, amsgrad, maximize, grad_scale, found_inf, decoupled)
    return fused


for _op, _decoupled in ((aten._fused_adam_, False), (aten._fused_adamw_, True)):
    DECOMPOSITIONS[_op.default] = _adam(_decoupled)
    DECOMPOSITIONS[_op.tensor_lr] = _adam(_decoupled)
