"""Losses and their backward ops, with PyTorch's reductions (0 none, 1 mean, 2 sum):

- NLL (1-d and 2-d), MSE, binary cross-entropy, smooth L1 and Huber, forward and backward;
- the multi-class and multi-label margin losses' backward, and the multi-label forward
  (PyTorch's decomposition counts targets after the first -1, its CPU kernel does not).
  PyTorch has no meta kernel for either backward op and they have no shape rule yet
  (``registry.SHAPE_RULES``): until they do, they run on the CPU;
- CTC, forward and backward (``_ctc_loss``, ``_ctc_loss_backward``; lengths as lists, or as
  tensors in the ``.Tensor`` overloads, whose values stay on the device and only mask):
  alpha by a scan over time, beta by a reverse scan, PyTorch's CPU formulas. PyTorch has
  no meta kernel for the ``.Tensor`` forward nor for the backward: their shape rules are
  here. With tensor lengths the longest target is a value, so log_alpha (an output only
  the backward reads) is as wide as the targets allow (2 * targets.shape[1] + 1, or
  2 * targets.numel() + 1 for concatenated targets) where PyTorch's is 2 * the longest
  target + 1; the extra columns are -inf;
- ``F.linear_cross_entropy``'s chunked custom ops
  (``torch_nn::_linear_cross_entropy_batch_chunked[_no_reduction]``): one unchunked program.

Piecewise backward formulas copy PyTorch's boundary conventions; MSE's backward is the vjp of
its forward. Touches only the registries.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from ..xla.widths import long_dtype
from ..xla import precision
from .nn_helpers import _f, _s, _vjp
from .program import check_index
from .registry import register, shape_rule

_REDUCTION_NONE, _REDUCTION_MEAN, _REDUCTION_SUM = 0, 1, 2


def _reduce(loss, reduction):
    if reduction == _REDUCTION_MEAN:
        return jnp.mean(loss)
    if reduction == _REDUCTION_SUM:
        return jnp.sum(loss)
    return loss


def _loss_norm(grad, x, reduction):
    """Scale of a pointwise loss's backward: 1/numel for mean, 1 otherwise."""
    if reduction == _REDUCTION_MEAN:
        return grad / x.size
    return grad


def _nll_parts(x, target, weight, ignore_index):
    """(class axis, valid mask, safe target, per-element weight with ignored set to 0)."""
    cdim = 1 if x.ndim > 1 else 0
    valid = target != ignore_index
    t = jnp.where(valid, target, 0)
    w = jnp.take(weight, t, axis=0) if weight is not None else jnp.ones(t.shape, x.dtype)
    return cdim, valid, t, jnp.where(valid, w.astype(x.dtype), 0)


def _nll_forward(sig, x, target, weight, reduction, ignore_index):
    x = _f(x)
    cdim, valid, t, w = _nll_parts(x, target, _f(weight), ignore_index)
    n = x.shape[cdim]
    check_index(jnp.where(valid, target, 0), n, "Target {value} is out of bounds.", "IndexError")
    picked = jnp.take_along_axis(x, jnp.expand_dims(t, cdim), axis=cdim).squeeze(cdim)
    losses = jnp.where(valid, -picked * w, 0)
    if reduction == _REDUCTION_NONE and x.ndim > 1:
        return losses, jnp.zeros((), x.dtype)  # PyTorch leaves total_weight at 0 here
    total = jnp.sum(w)
    loss = jnp.sum(losses)
    return (loss / total if reduction == _REDUCTION_MEAN else loss), total


def _nll_backward(sig, grad, x, target, weight, reduction, ignore_index, total_weight):
    x, grad = _f(x), _f(grad)
    cdim, valid, t, w = _nll_parts(x, target, _f(weight), ignore_index)
    if reduction == _REDUCTION_MEAN:
        grad = grad / total_weight.astype(x.dtype)
    coef = jnp.where(valid, -w * grad, 0)
    onehot = jax.nn.one_hot(t, x.shape[cdim], dtype=x.dtype, axis=cdim)
    return onehot * jnp.expand_dims(coef, cdim)


register("nll_loss_forward.default", "nll_loss2d_forward.default")(_nll_forward)


register("nll_loss_backward.default", "nll_loss2d_backward.default")(_nll_backward)


def _mse(x, t, reduction):
    return _reduce((x - t) ** 2, reduction)


@register("mse_loss.default")
def mse_loss(sig, x, t, reduction=_REDUCTION_MEAN):
    return _mse(_f(x), _f(t), reduction)


@register("mse_loss_backward.default")
def mse_loss_backward(sig, grad, x, t, reduction):
    t = _f(t)
    return _vjp(lambda x_: _mse(x_, t, reduction), (_f(x),), _f(grad))[0]


_BCE_EPS = 1e-12  # PyTorch's floor for x * (1 - x) in the BCE backward


@register("binary_cross_entropy.default")
def binary_cross_entropy(sig, x, t, weight=None, reduction=_REDUCTION_MEAN):
    x, t = _f(x), _f(t)
    floor = _s(-100, x)  # PyTorch clamps the logs at -100
    loss = (t - 1) * jnp.maximum(jnp.log1p(-x), floor) - t * jnp.maximum(jnp.log(x), floor)
    if weight is not None:
        loss = loss * _f(weight)
    return _reduce(loss, reduction)


@register("binary_cross_entropy_backward.default")
def binary_cross_entropy_backward(sig, grad, x, t, weight=None, reduction=_REDUCTION_MEAN):
    x, t, grad = _f(x), _f(t), _f(grad)
    g = _loss_norm(grad, x, reduction) * (x - t) / jnp.maximum((1 - x) * x, _s(_BCE_EPS, x))
    if weight is not None:
        g = g * _f(weight)
    return g


@register("smooth_l1_loss.default")
def smooth_l1_loss(sig, x, t, reduction=_REDUCTION_MEAN, beta=1.0):
    z = jnp.abs(_f(x) - _f(t))
    loss = z - 0.5 * beta if beta == 0 else jnp.where(z < beta, 0.5 * z * z / beta, z - 0.5 * beta)
    return _reduce(loss, reduction)


@register("smooth_l1_loss_backward.default")
def smooth_l1_loss_backward(sig, grad, x, t, reduction, beta):
    x, t, grad = _f(x), _f(t), _f(grad)
    d = x - t
    g = _loss_norm(grad, x, reduction)
    inner = d * g / beta if beta != 0 else jnp.zeros_like(d)
    return jnp.where(d <= -beta, -g, jnp.where(d >= beta, g, inner))


@register("huber_loss.default")
def huber_loss(sig, x, t, reduction=_REDUCTION_MEAN, delta=1.0):
    z = jnp.abs(_f(x) - _f(t))
    return _reduce(jnp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta)), reduction)


@register("huber_loss_backward.default")
def huber_loss_backward(sig, grad, x, t, reduction, delta):
    x, t, grad = _f(x), _f(t), _f(grad)
    d = x - t
    g = _loss_norm(grad, x, reduction)
    return jnp.where(d <= -delta, -g * delta, jnp.where(d >= delta, g * delta, d * g))


# -- margin losses' backward ---------------------------------------------------------------
def _margin_scale(grad, x2, reduction):
    """The upstream gradient per sample, divided by dim (and by the batch for a mean)."""
    n, dim = x2.shape
    g = _f(grad).astype(x2.dtype)
    if reduction == _REDUCTION_NONE:
        g = g.reshape(-1, 1) if g.ndim else g
    elif reduction == _REDUCTION_MEAN:
        g = g / n
    return g / dim


@shape_rule("multi_margin_loss_backward.default", "multilabel_margin_loss_backward.default")
def _grad_like_input(grad, x, *args, **kwargs):  # no meta kernel in PyTorch: the input's gradient
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@register("multi_margin_loss_backward.default")
def multi_margin_loss_backward(sig, grad, x, target, p, margin, weight=None, reduction=_REDUCTION_MEAN):
    """PyTorch's CPU rule: each class d != target with z = margin - x[t] + x[d] > 0 gets
    g (p = 1) or 2 g z (p = 2), times weight[t]; the target gets minus their sum."""
    x2 = _f(x).reshape(-1, x.shape[-1]) if x.ndim else _f(x).reshape(1, 1)
    t = target.reshape(-1)
    xt = jnp.take_along_axis(x2, t[:, None], axis=1)
    z = margin - xt + x2
    g = _margin_scale(grad, x2, reduction)
    h = jnp.where(jnp.asarray(p) == 1, g, 2 * g * z)
    if weight is not None:
        h = h * _f(weight).astype(x2.dtype)[t][:, None]
    not_t = jnp.arange(x2.shape[1])[None, :] != t[:, None]
    h = jnp.where(not_t & (z > 0), h, 0)
    h = jnp.where(not_t, h, -jnp.sum(h, axis=1, keepdims=True))
    return jnp.broadcast_to(h, x2.shape).reshape(x.shape)


def _multilabel_parts(x, target):
    x2 = _f(x).reshape(-1, x.shape[-1]) if x.ndim else _f(x).reshape(1, 1)
    t = target.reshape(x2.shape)
    listed = jnp.cumprod((t != -1).astype(jnp.int32), axis=1).astype(bool)   # before the first -1
    tc = jnp.where(listed, t, 0)
    onehot = jax.nn.one_hot(tc, x2.shape[1], dtype=x2.dtype) * listed[..., None]   # [n, slots, dim]
    return x2, listed, tc, onehot


@register("multilabel_margin_loss_forward.default")
def multilabel_margin_loss_forward(sig, x, target, reduction):
    """(loss, is_target) as PyTorch's CPU kernel: only the targets before the first -1 count;
    each pairs with every non-target class: max(0, 1 - x[j] + x[d]) / dim."""
    x2, listed, tc, onehot = _multilabel_parts(x, target)
    is_t = jnp.max(onehot, axis=1) > 0                                       # [n, dim]
    xt = jnp.take_along_axis(x2, tc, axis=1)
    z = jnp.maximum(1 - xt[:, :, None] + x2[:, None, :], 0)
    per = jnp.sum(jnp.where(listed[:, :, None] & ~is_t[:, None, :], z, 0), axis=(1, 2)) / x2.shape[1]
    if reduction == _REDUCTION_MEAN:
        loss = jnp.mean(per)
    elif reduction == _REDUCTION_SUM:
        loss = jnp.sum(per)
    else:
        loss = per.reshape(sig.outs[0].shape)
    return loss, is_t.astype(x2.dtype).reshape(x.shape)


@register("multilabel_margin_loss_backward.default")
def multilabel_margin_loss_backward(sig, grad, x, target, reduction, is_target):
    """For each listed target j (the list ends at the first -1) and each non-target d with
    z = 1 - x[j] + x[d] > 0: x[j] gets -g, x[d] gets +g (PyTorch's CPU rule)."""
    x2, listed, tc, onehot = _multilabel_parts(x, target)
    xt = jnp.take_along_axis(x2, tc, axis=1)                                  # [n, slots]
    other = ~is_target.reshape(x2.shape).astype(bool)                         # [n, dim]
    hit = listed[:, :, None] & other[:, None, :] & ((1 - xt[:, :, None] + x2[:, None, :]) > 0)
    g = _margin_scale(grad, x2, reduction)
    g = g[:, :, None] if jnp.ndim(g) == 2 else g
    count_d = jnp.sum(hit, axis=1).astype(x2.dtype)                           # [n, dim]
    count_j = jnp.sum(hit, axis=2).astype(x2.dtype)                           # [n, slots]
    gin = count_d - jnp.einsum("ns,nsd->nd", count_j, onehot, precision=precision.of("algorithm"))
    gscale = g[:, :, 0] if jnp.ndim(g) == 3 else g
    return (gin * gscale).reshape(x.shape)


# -- CTC -----------------------------------------------------------------------------------
def _ctc_bound(targets):
    """The longest target a ``_ctc_loss.Tensor`` call can have without reading the lengths:
    the padded width of 2-d targets, all of 1-d (concatenated) targets."""
    return targets.shape[1] if targets.dim() == 2 else targets.shape[0]


def _ctc_check(log_probs, targets, input_lengths, target_lengths, blank):
    if log_probs.dim() != 3:
        raise RuntimeError(f"ctc_loss: expected log_probs to have 3 dimensions (T, N, C), but got {log_probs.dim()}")
    n = log_probs.shape[1]
    if not 0 <= blank < log_probs.shape[2]:
        raise RuntimeError("blank must be in label range")
    for name, lengths in (("input_lengths", input_lengths), ("target_lengths", target_lengths)):
        if isinstance(lengths, torch.Tensor):  # the .Tensor overloads; the others take int lists
            if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
                raise RuntimeError(f"{name} must be integral")
        if (lengths.numel() if isinstance(lengths, torch.Tensor) else len(lengths)) != n:
            raise RuntimeError(f"{name} must be of size batch_size")
    if targets.dim() == 2 and targets.shape[0] != n:
        raise RuntimeError("Expected tensor to have size batch_size at dimension 0 (targets)")


@shape_rule("_ctc_loss.Tensor")
def _ctc_loss_tensor_shapes(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """(neg_log_likelihood [N], log_alpha [N, T, 2 L + 1]); PyTorch's CPU kernel makes L the
    longest target length, a value: here L is its bound (``_ctc_bound``), the extra
    columns of log_alpha -inf."""
    _ctc_check(log_probs, targets, input_lengths, target_lengths, blank)
    T, N = log_probs.shape[:2]
    return (torch.empty((N,), dtype=log_probs.dtype, device="meta"),
            torch.empty((N, T, 2 * _ctc_bound(targets) + 1), dtype=log_probs.dtype, device="meta"))


@shape_rule("_ctc_loss_backward.default", "_ctc_loss_backward.Tensor")
def _ctc_loss_backward_shapes(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha,
                              blank, zero_infinity=False):
    _ctc_check(log_probs, targets, input_lengths, target_lengths, blank)
    return torch.empty(tuple(log_probs.shape), dtype=log_probs.dtype, device="meta")


def _ctc_setup(lp, targets, input_lengths, target_lengths, blank, S):
    """(input lengths [N], target lengths [N], extended targets l' [N, S] (blank, l1, blank,
    l2, ..., blank; blank past the target), states inside l' [N, S], the skips allowed into
    s from s - 2 (l'[s] != l'[s - 2]) [N, S], log_probs at l' [T, N, S]). The lengths are
    static lists or device values alike."""
    T, N, _ = lp.shape
    il = jnp.broadcast_to(jnp.asarray(input_lengths).astype(long_dtype()).reshape(-1), (N,))
    tl = jnp.broadcast_to(jnp.asarray(target_lengths).astype(long_dtype()).reshape(-1), (N,))
    s_idx = jnp.arange(S)
    j = s_idx // 2
    width = targets.shape[-1] if targets.ndim == 2 else targets.shape[0]
    if width == 0:
        lab = jnp.full((N, S), blank, long_dtype())
    elif targets.ndim == 2:
        lab = jnp.take(targets, jnp.minimum(j, width - 1), axis=1)
    else:  # concatenated: sample b's target starts after the targets before it
        start = jnp.cumsum(tl) - tl
        lab = targets[jnp.clip(start[:, None] + j[None, :], 0, width - 1)]
    odd = (s_idx % 2 == 1)[None, :]
    ext = jnp.where(odd & (j[None, :] < tl[:, None]), lab, blank).astype(long_dtype())
    inside = s_idx[None, :] <= 2 * tl[:, None]
    skip = jnp.concatenate([jnp.zeros((N, min(2, S)), bool), ext[:, 2:] != ext[:, :-2]], axis=1)
    lpe = jnp.take_along_axis(lp, jnp.broadcast_to(ext[None], (T, N, S)), axis=2)
    return il, tl, ext, inside, skip, lpe


def _logsumexp3(a, b, c):
    """log(e^a + e^b + e^c) as PyTorch's CTC kernels take it (shifted by the largest; by 0
    when all are -inf)."""
    m = jnp.maximum(jnp.maximum(a, b), c)
    m = jnp.where(m == -jnp.inf, 0, m)
    return jnp.log(jnp.exp(a - m) + jnp.exp(b - m) + jnp.exp(c - m)) + m


def _shift(x, k, fill):
    """x[:, s - k] (k > 0) or x[:, s + |k|] (k < 0) along the last axis, ``fill`` outside."""
    N, S = x.shape
    pad = jnp.full((N, min(abs(k), S)), fill, x.dtype)
    if k > 0:
        return jnp.concatenate([pad, x[:, :S - k]], axis=1) if S > k else pad
    return jnp.concatenate([x[:, -k:], pad], axis=1) if S > -k else pad


@register("_ctc_loss.default", "_ctc_loss.Tensor")
def ctc_loss(sig, log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """(negative log likelihood [N], log alpha [N, T, S]) by PyTorch's CPU recursion over
    time (Graves et al., eq. 6-8), one ``lax.scan`` step per time step; S = 2 * the longest
    target + 1 (``.Tensor``: its bound). Entries PyTorch leaves unwritten (past a sample's
    input length or its extended target) are -inf. A sample with input length 0 has
    likelihood 1 if its target is empty, else 0. ``zero_infinity`` acts in ``ctc_loss``,
    not here."""
    lp = _f(log_probs)
    T, N, _ = lp.shape
    S = sig.outs[1].shape[2]
    il, tl, ext, inside, skip, lpe = _ctc_setup(lp, targets, input_lengths, target_lengths, blank, S)
    ninf = jnp.asarray(-jnp.inf, lp.dtype)
    s_idx = jnp.arange(S)[None, :]
    a0 = jnp.where(s_idx == 0, lpe[0], jnp.where((s_idx == 1) & (tl[:, None] > 0), lpe[0], ninf))

    def step(prev, lp_t):
        new = _logsumexp3(prev, _shift(prev, 1, ninf), jnp.where(skip, _shift(prev, 2, ninf), ninf)) + lp_t
        new = jnp.where(inside, new, ninf)
        return new, new

    _, rest = jax.lax.scan(step, a0, lpe[1:])
    alpha = jnp.concatenate([a0[None], rest], axis=0)                      # [T, N, S]
    alpha = jnp.where((jnp.arange(T)[:, None] < il[None, :])[..., None], alpha, ninf)
    last = jnp.take_along_axis(alpha, jnp.clip(il - 1, 0, T - 1)[None, :, None], axis=0)[0]   # [N, S]
    pick = lambda s: jnp.take_along_axis(last, jnp.clip(s, 0, S - 1)[:, None], axis=1)[:, 0]  # noqa: E731
    l1, l2 = pick(2 * tl), pick(2 * tl - 1)
    m = jnp.maximum(l1, l2)
    m = jnp.where(m == ninf, 0, m)
    ll = jnp.where(tl == 0, last[:, 0], jnp.log(jnp.exp(l1 - m) + jnp.exp(l2 - m)) + m)
    ll = jnp.where(il == 0, jnp.where(tl == 0, 0, ninf), ll)
    return -ll, jnp.transpose(alpha, (1, 0, 2))


@register("_ctc_loss_backward.default", "_ctc_loss_backward.Tensor")
def ctc_loss_backward(sig, grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha,
                      blank, zero_infinity=False):
    """PyTorch's CPU gradient (Graves et al., eq. 10-16): beta by the backward recursion
    from each sample's last input step (a reverse ``lax.scan``), then for each (t, n, c)
    the log-sum of alpha * beta over the states s with l'[s] = c, and
    grad = (exp(lp) - exp(that + nll - lp)) * grad_out; 0 past the input length, and for a
    sample of infinite loss when ``zero_infinity``. log_alpha is the forward's (only its
    entries inside each sample's lengths are read)."""
    lp = _f(log_probs)
    T, N, C = lp.shape
    S = log_alpha.shape[2]
    il, tl, ext, inside, skip, lpe = _ctc_setup(lp, targets, input_lengths, target_lengths, blank, S)
    ninf = jnp.asarray(-jnp.inf, lp.dtype)
    s_idx = jnp.arange(S)[None, :]
    skip_back = _shift(skip, -2, False)                         # into s from s + 2
    ends = (s_idx == 2 * tl[:, None]) | ((s_idx == 2 * tl[:, None] - 1) & (tl[:, None] > 0))

    def step(nxt, xs):
        t, lp_t = xs
        rec = _logsumexp3(nxt, _shift(nxt, -1, ninf), jnp.where(skip_back, _shift(nxt, -2, ninf), ninf)) + lp_t
        first = jnp.where(ends, lp_t, ninf)                      # beta at t = input length - 1
        cur = jnp.where((t == il - 1)[:, None], first, jnp.where((t < il - 1)[:, None], rec, ninf))
        cur = jnp.where(inside, cur, ninf)
        return cur, cur

    _, beta = jax.lax.scan(step, jnp.full((N, S), ninf), (jnp.arange(T), lpe), reverse=True)   # [T, N, S]
    alpha = jnp.transpose(_f(log_alpha).astype(lp.dtype), (1, 0, 2))
    valid = inside[None] & (jnp.arange(T)[:, None] < il[None, :])[..., None]
    ab = jnp.where(valid, alpha + beta, ninf)                   # [T, N, S]
    # log-sum over the states of each class: the largest first, then the sum of the rest
    tt = jnp.broadcast_to(jnp.arange(T)[:, None, None], ab.shape)
    nn = jnp.broadcast_to(jnp.arange(N)[None, :, None], ab.shape)
    cc = jnp.broadcast_to(ext[None], ab.shape)
    big = jnp.full((T, N, C), ninf).at[tt, nn, cc].max(ab)
    big = jnp.where(big == ninf, 0, big)
    total = jnp.zeros((T, N, C), lp.dtype).at[tt, nn, cc].add(jnp.exp(ab - big[tt, nn, cc]))
    collected = jnp.log(total) + big
    nll = _f(neg_log_likelihood).astype(lp.dtype)
    gr = _f(grad).astype(lp.dtype).reshape(-1)
    g = (jnp.exp(lp) - jnp.exp(collected + nll[None, :, None] - lp)) * gr[None, :, None]
    g = jnp.where((jnp.arange(T)[:, None] < il[None, :])[..., None], g, 0)
    if zero_infinity:
        g = jnp.where((nll == jnp.inf)[None, :, None], 0, g)
    return g


# -- F.linear_cross_entropy's chunked custom ops -------------------------------------------
def _lce_rows(x, w, target, bias, class_weight, ignore_index):
    """Per row: the weight of its target (0 where ignored) and -log_softmax at the target,
    as the chunked accumulator computes them (logits shifted by their row maximum)."""
    logits = jnp.matmul(x, w.T, precision=precision.of("linear_cross_entropy"))
    if bias is not None:
        logits = logits + bias
    shifted = logits - jnp.max(logits, axis=1, keepdims=True)
    ignored = target == ignore_index
    t = jnp.where(ignored, 0, target)
    picked = jnp.take_along_axis(shifted, t[:, None], axis=1)[:, 0]
    denom = jnp.sum(jnp.exp(shifted), axis=1)
    wt = jnp.ones(t.shape, x.dtype) if class_weight is None else jnp.take(class_weight, t).astype(x.dtype)
    return jnp.where(ignored, 0, wt), jnp.log(denom) - picked


def _lce_chunked(sig, x, w, target, bias, class_weight, reduction, ignore_index, label_smoothing,
                 batch_chunk_size, acc_policy, acc_dtype, allow_retain_graph, compute_input_grad,
                 compute_linear_weight_grad, compute_linear_bias_grad):
    """The loss (mean: NaN when no row counts) and, as asked, its gradients for the input,
    the linear weight and bias (empty otherwise), computed at once as the op does."""
    x32, w32 = _f(x), _f(w).astype(_f(x).dtype)
    b32 = None if bias is None else _f(bias).astype(x32.dtype)
    cw = None if class_weight is None else _f(class_weight)

    def loss_of(x_, w_, b_):
        wt, nll = _lce_rows(x_, w_, target, b_, cw, ignore_index)
        total = jnp.sum(wt * nll)
        if reduction == "mean":
            d = jnp.sum(wt)
            return jnp.where(d == 0, jnp.nan, total / jnp.where(d == 0, 1, d))
        return total

    prim = (x32, w32, b32 if b32 is not None else jnp.zeros(w32.shape[:1], x32.dtype))
    loss, pull = jax.vjp(lambda a, b, c: loss_of(a, b, c if bias is not None else None), *prim)
    gx, gw, gb = pull(jnp.ones((), loss.dtype))
    outs = [loss]
    for want, g, meta in ((compute_input_grad, gx, sig.outs[1]), (compute_linear_weight_grad, gw, sig.outs[2]),
                          (compute_linear_bias_grad, gb, sig.outs[3])):
        outs.append(g if want else jnp.zeros(meta.shape, g.dtype))
    return tuple(outs)


def _lce_no_reduction(sig, x, w, target, bias, class_weight, ignore_index, batch_chunk_size, acc_policy,
                      acc_dtype):
    """The per-row loss: its target's weight times -log_softmax at the target (0 if ignored)."""
    x32 = _f(x)
    wt, nll = _lce_rows(x32, _f(w).astype(x32.dtype), target, None if bias is None else _f(bias).astype(x32.dtype),
                        None if class_weight is None else _f(class_weight), ignore_index)
    return wt * nll


try:
    import torch.nn.modules.linear_cross_entropy  # noqa: F401  (defines the torch_nn ops)
    _TORCH_NN = torch.ops.torch_nn
    register(_TORCH_NN._linear_cross_entropy_batch_chunked.default)(_lce_chunked)
    register(_TORCH_NN._linear_cross_entropy_batch_chunked_no_reduction.default)(_lce_no_reduction)
except (ImportError, AttributeError):  # a PyTorch without F.linear_cross_entropy's chunked path
    pass
