"""Cross entropy as one node: ``lazyxla::cross_entropy`` and ``lazyxla::cross_entropy_backward``.

``F.cross_entropy`` (class-index targets, no class weights, no label smoothing) on the lazy
device records these two ops of lazyxla's own (``frontend.cross_entropy`` routes it here and
gives it its gradient) instead of PyTorch's composite, ``log_softmax`` then ``nll_loss``. The
composite makes the log-probabilities a value: a float32 ``[tokens, vocabulary]`` array that
the program writes whole (GPT-2 at 8 x 1024 tokens: 1.6 GB, 5 ms of a TPU step) to pick one
element per row. Here the forward keeps two numbers per row, the row's maximum and the log of
its sum of exponentials (PyTorch's own two steps, so the loss is the composite's to the bit:
``logp = (x - max) - log(sum(exp(x - max)))``), and picks ``logp`` at the target from them;
the backward computes the gradient from the logits and those two numbers,
``(exp(logp) - onehot(target)) * grad / count`` (zero in ignored rows), in the order the
composite's two backward ops compute it.

PyTorch's rules kept: ``ignore_index`` rows give no loss, no count and no gradient; ``mean``
divides by the count of the other rows (all ignored: 0/0, NaN, as PyTorch); a target out of
range raises PyTorch's ``Target k is out of bounds.``. Touches only the registry.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from .program import check_index
from .registry import register

_LIB = torch.library.Library("lazyxla", "FRAGMENT")
_LIB.define("cross_entropy(Tensor x, Tensor target, int reduction, SymInt ignore_index) -> (Tensor, Tensor, Tensor)")
_LIB.define("cross_entropy_backward(Tensor grad, Tensor x, Tensor target, Tensor row_max, Tensor row_logsum, "
            "int reduction, SymInt ignore_index) -> Tensor")
CROSS_ENTROPY = torch.ops.lazyxla.cross_entropy.default
CROSS_ENTROPY_BACKWARD = torch.ops.lazyxla.cross_entropy_backward.default

_NONE, _MEAN, _SUM = 0, 1, 2  # PyTorch's reduction enum


@torch.library.register_fake("lazyxla::cross_entropy")
def _cross_entropy_shapes(x, target, reduction, ignore_index):
    loss = x.new_empty(target.shape if reduction == _NONE else ())
    return loss, x.new_empty(x.shape[:1]), x.new_empty(x.shape[:1])


@torch.library.register_fake("lazyxla::cross_entropy_backward")
def _cross_entropy_backward_shapes(grad, x, target, row_max, row_logsum, reduction, ignore_index):
    return torch.empty_like(x)


def _rows(x, target, ignore_index):
    """(rows that count, the target with ignored rows at class 0)."""
    valid = target != ignore_index
    t = jnp.where(valid, target, 0)
    check_index(t, x.shape[1], "Target {value} is out of bounds.", "IndexError")
    return valid, t


@register(CROSS_ENTROPY)
def _cross_entropy(sig, x, target, reduction, ignore_index):
    valid, t = _rows(x, target, ignore_index)
    row_max = jnp.max(x, axis=1)
    row_logsum = jnp.log(jnp.sum(jnp.exp(x - row_max[:, None]), axis=1))
    # the target's logit by a masked row sum, not a gather: XLA fuses it into the pass that sums
    # the row's exponentials, where a gather needs the logits materialized in their own layout
    # (GPT-2 on a TPU: a 1.6 GB float32 copy of the logits to pick 8192 of them)
    picked = jnp.sum(jnp.where(jnp.arange(x.shape[1])[None, :] == t[:, None], x, 0), axis=1)
    losses = jnp.where(valid, -((picked - row_max) - row_logsum), 0)
    if reduction == _NONE:
        return losses, row_max, row_logsum
    loss = jnp.sum(losses)
    if reduction == _MEAN:
        loss = loss / jnp.sum(valid.astype(x.dtype))
    return loss, row_max, row_logsum


@register(CROSS_ENTROPY_BACKWARD)
def _cross_entropy_backward(sig, grad, x, target, row_max, row_logsum, reduction, ignore_index):
    valid, t = _rows(x, target, ignore_index)
    if reduction == _MEAN:
        grad = grad / jnp.sum(valid.astype(x.dtype))
    # nll_loss's backward (the target's column gets -grad) through log_softmax's (minus
    # exp(logp) times the row's sum), in the composite's order of operations
    neg = jnp.where(valid, -grad, 0)[:, None]  # reduction none: one per row; else one for all rows
    p = jnp.exp((x - row_max[:, None]) - row_logsum[:, None])
    onehot = jax.nn.one_hot(t, x.shape[1], dtype=x.dtype)
    return onehot * neg - p * neg
