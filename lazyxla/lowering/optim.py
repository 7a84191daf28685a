"""PyTorch's fused optimizer steps (``torch.optim.Adam/AdamW(fused=True)``, transformers'
default optimizer, and ``SGD(fused=True)``: ``lower_fused_sgd``) as one JAX function over every
parameter of the step.

``_fused_adam_`` and ``_fused_adamw_`` update whole lists of parameters and their state in
place and have no PyTorch decomposition (on the CPU, each step would read every parameter to
the host). ``optimizer_stacks`` records a call as one node whose operands are the lists (the
moments of alike parameters stacked) and whose outputs are their new values;
``lower_fused_adam`` computes, per parameter, what PyTorch's CPU kernel computes: the gradient
unscaled by ``grad_scale`` (given back: the kernel writes it) and negated under ``maximize``;
weight decay (AdamW: the parameter shrinks by ``lr * weight_decay``; Adam: added to the
gradient); the moments (``lerp``, the squared gradient); the bias corrections from each step
count (which the optimizer keeps on the device; computed once per distinct count, and equal
counts are one input: ``optimizer_counts``); amsgrad's running maximum; and nothing changed
where ``found_inf`` (a gradient scaler's) is set. The learning rate is an operand (a scheduler
changes it every step); the other settings are the signature's. Touches nothing.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .program import stack_rows


def lower_fused_adam(sig, *xs, n, groups, stacked_grads, stacked_params, beta1, beta2, weight_decay, eps, amsgrad,
                     maximize, decoupled, scaled, checked):
    """``xs``: per group (``groups``: positions of same-shaped params, in the order stepped), its
    parameters (one ``[L, *shape]`` operand where ``stacked_params`` says so: ``param_stacks``,
    else one per member); per group its gradients (one stacked operand where ``stacked_grads``
    says so, else one per member); per moment list (exp_avgs, exp_avg_sqs, [max_exp_avg_sqs]),
    per group, its moments (one stacked ``[L, *shape]`` operand; a group of one parameter: its
    own); the ``n`` step counts; lr; [grad_scale]; [found_inf]; the rows' offsets (int32 data).
    Returns the new params in the operands' layout, the new moments in theirs, and [the
    unscaled grads], in that order.

    A group's moments are updated stacked (one kernel per moment, whatever the number of
    members), and so are its parameters when they share one step count: a stack of them given
    back whole, or (parameters of their own) stacked in the program, each new one taken at its
    row's runtime offset (one kernel for every row); otherwise each parameter's update reads
    its rows. Both are nested ``jax.jit``s of the settings: traced once per shape. A group of
    one keeps its parameter's shape throughout: read through a reshape (``[1, *shape]``), its
    moments' arithmetic was fused into the parameter's update as well, which then read the old
    moments after their donated buffers were overwritten, so XLA kept a copy of every such
    moment (ResNet-18's program: 153 MB of temporaries, 97 MB without)."""
    it = iter(xs)
    params = []  # per group: its stack, or its members
    for ix, sp in zip(groups, stacked_params):
        params.append(next(it) if sp else [next(it) for _ in ix])
    grads = []  # per group: [L, *shape], or a group of one's own
    for ix, sg in zip(groups, stacked_grads):
        if sg:
            g = next(it)
            grads.append(g if len(ix) > 1 else g[0])
        else:
            grads.append(next(it) if len(ix) == 1 else stack_rows([next(it) for _ in ix]))
    nm = 3 if amsgrad else 2
    moments = [[next(it) for _ in groups] for _ in range(nm)]
    steps = [next(it) for _ in range(n)]
    lr = next(it)
    scale = next(it) if scaled else None
    inf = next(it) if checked else None
    rows = list(it)
    keep = (inf == 0).reshape(()) if checked else None
    bias = {}  # a step count's bias corrections, once per distinct count (``optimizer_counts``: all one)
    for s in steps:
        if id(s) not in bias:
            step = s.reshape(()).astype(jnp.float32)
            bias[id(s)] = (1 - jnp.power(jnp.float32(beta1), step), jnp.sqrt(1 - jnp.power(jnp.float32(beta2), step)))
    stacked = _moments_step(beta1, beta2, weight_decay, maximize, decoupled, scaled, checked, amsgrad)
    one = _param_step(weight_decay, eps, decoupled, checked)
    new_p = []
    new_moments = [[] for _ in range(nm)]
    unscaled = [None] * n
    for g, ix in enumerate(groups):
        sp = stacked_params[g]
        ps = params[g]
        whole = ps if sp else (jnp.stack(ps) if len(ix) > 1 else ps[0])  # (traced only where read)
        got = stacked(grads[g], whole if weight_decay != 0 and not decoupled else None,
                      *(moments[j][g] for j in range(nm)), *((scale,) if scaled else ()),
                      *((keep,) if checked else ()))
        fresh, kept, g_used = got[:nm], got[nm:2 * nm], got[2 * nm]
        for j in range(nm):
            new_moments[j].append(kept[j])
        denom_src = fresh[2] if amsgrad else fresh[1]
        row = (lambda x, k: x) if len(ix) == 1 else \
            (lambda x, k: jax.lax.dynamic_index_in_dim(x, rows[k], 0, False) if k < len(rows) else x[k])
        counts = {id(steps[i]) for i in ix}
        if len(ix) > 1 and len(counts) == 1:  # one count: the members' updates as one stacked kernel
            new_stack = one(whole, fresh[0], denom_src, *bias[counts.pop()], lr, *((keep,) if checked else ()))
            new_p += [new_stack] if sp else [row(new_stack, k) for k in range(len(ix))]
        else:
            each = [one(ps[k], row(fresh[0], k), row(denom_src, k), *bias[id(steps[i])], lr,
                        *((keep,) if checked else ())) for k, i in enumerate(ix)]
            new_p += [jnp.stack(each)] if sp else each
        if scaled:
            for k, i in enumerate(ix):
                unscaled[i] = row(g_used, k)
    moments_out = tuple(m for per_list in new_moments for m in per_list)
    return tuple(new_p) + moments_out + (tuple(unscaled) if scaled else ())


@functools.lru_cache(maxsize=64)
def _moments_step(beta1, beta2, weight_decay, maximize, decoupled, scaled, checked, amsgrad):
    """A group's stacked moments for these settings: (g, p stacked or None, m, v, [vmax],
    [scale], [keep]) -> (new m, v, [vmax]; the same kept where ``found_inf`` is unset; the
    gradient as used (unscaled))."""

    def step(g, p, m, v, *rest):
        vmax, rest = (rest[0], rest[1:]) if amsgrad else (None, rest)
        scale = rest[0] if scaled else None
        keep = rest[-1] if checked else None
        if scaled:
            g = g / scale.reshape(()).astype(g.dtype)
        g_used = g
        if maximize:
            g = -g
        if weight_decay != 0 and not decoupled:
            g = g + p * weight_decay
        new_m = m + (g - m) * (1 - beta1)
        new_v = v * beta2 + (g * g) * (1 - beta2)
        fresh = (new_m, new_v) + ((jnp.maximum(vmax, new_v),) if amsgrad else ())
        old = (m, v) + ((vmax,) if amsgrad else ())
        kept = fresh if keep is None else tuple(jnp.where(keep, f, o) for f, o in zip(fresh, old))
        return fresh + kept + (g_used,)

    return jax.jit(step)


@functools.lru_cache(maxsize=64)
def _param_step(weight_decay, eps, decoupled, checked):
    """One parameter's update for these settings: (p, its new exp_avg, its new exp_avg_sq (or
    running maximum), bias1, bias2_sqrt, lr, [keep]) -> new p."""

    def one(p, m, v, bias1, bias2_sqrt, lr, *rest):
        dt = p.dtype
        lr_ = lr.reshape(()).astype(dt)
        new_p = p
        if weight_decay != 0 and decoupled:
            new_p = p - (p * weight_decay) * lr_
        denom = jnp.sqrt(v) / bias2_sqrt.astype(dt) + eps
        new_p = new_p - (lr_ / bias1.astype(dt)) * m / denom
        return new_p if not checked else jnp.where(rest[0], new_p, p)

    return jax.jit(one)


def lower_fused_sgd(sig, *xs, n, weight_decay, momentum, nesterov, maximize, first, scaled, checked):
    """``torch.optim.SGD(fused=True)``'s step. ``xs``: the ``n`` params, their ``n`` gradients,
    [their ``n`` momentum buffers: with momentum, after the first step], lr, the factor the
    gradient enters the buffer with (``1 - dampening``; 1 for a first step's zero buffers),
    [the momentum], [the weight decay] (each where it is non-zero: ``momentum`` and
    ``weight_decay`` here say so), [grad_scale], [found_inf]. Returns the new params, [the new
    buffers], [the unscaled grads].

    Per parameter, PyTorch's CPU kernel: the gradient divided by ``grad_scale`` (and written
    back), negated under ``maximize``, plus ``param * weight_decay``; the buffer becomes the
    gradient (``first``) or ``buf * momentum + grad * factor``; the step is the buffer, or
    under ``nesterov`` the gradient plus ``buf * momentum``; ``param - lr * step``. Half types
    compute in float32; where ``found_inf`` is set nothing changes."""
    it = iter(xs)
    params = [next(it) for _ in range(n)]
    grads = [next(it) for _ in range(n)]
    bufs = [next(it) for _ in range(n)] if momentum and not first else [None] * n
    lr, factor = next(it), next(it)
    mom_v = next(it) if momentum else None
    wd_v = next(it) if weight_decay else None
    scale = next(it) if scaled else None
    keep = (next(it) == 0).reshape(()) if checked else None
    new_p, new_b, unscaled = [], [], []
    for p, g, b in zip(params, grads, bufs):
        dt = p.dtype
        ct = jnp.float32 if dt in (jnp.bfloat16, jnp.float16) else dt
        g = g.astype(ct)
        if scaled:
            g = g / scale.reshape(()).astype(ct)
            unscaled.append(g.astype(dt))
        d = -g if maximize else g
        if weight_decay:
            d = d + p.astype(ct) * wd_v.reshape(()).astype(ct)
        if momentum:
            mom = mom_v.reshape(()).astype(ct)
            buf = d if first else b.astype(ct) * mom + d * factor.reshape(()).astype(ct)
            d = d + buf * mom if nesterov else buf
            new_b.append(buf.astype(dt))
        new_p.append((p.astype(ct) - lr.reshape(()).astype(ct) * d).astype(dt))
    if checked:
        new_p = [jnp.where(keep, x, o) for x, o in zip(new_p, params)]
        if momentum:
            new_b = [jnp.where(keep, x, o) for x, o in zip(new_b, bufs if not first else grads)]
        unscaled = [jnp.where(keep, x, o) for x, o in zip(unscaled, grads)]
    return tuple(new_p) + tuple(new_b) + tuple(unscaled)
