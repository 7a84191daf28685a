"""The fused SGD step (``torch.optim.SGD(fused=True)``) recorded as one node.

``_fused_sgd_`` updates lists of parameters, their momentum buffers and (under a gradient
scaler) their gradients in place; it has no PyTorch decomposition, so without this record each
step ran on the CPU (``aten::_fused_sgd_``) and read every parameter to the host. Here one call
is one node (``lowering.lower_fused_sgd``) whose outputs are the new values of everything it
writes. What stays a setting of the signature and what is data:

| argument                                   | in the program                                 |
|--------------------------------------------|------------------------------------------------|
| ``lr`` (a number, a CPU or a device tensor) | data: a scheduler changes it every step       |
| ``1 - dampening``                          | data: 1 at the first step into zero buffers    |
| weight_decay, momentum                     | data (whether each is zero: the signature's): OneCycleLR cycles the momentum every step |
| nesterov, maximize                         | the signature's settings                       |
| grad_scale, found_inf                      | operands, when given                           |
| ``is_first_step``                          | never true here (below)                        |

PyTorch's first step (no buffers yet) passes ``is_first_step``: the buffer becomes the gradient.
``optimizer_state`` gives such a step zero buffers first, so the flag is off and the steady
step's formula runs, ``buf * momentum + grad * (1 - dampening)``, with the factor 1 for those
buffers: the gradient, exactly, and one graph for every step. A call whose buffers are partly
fresh and partly not is recorded as two nodes. A call that does pass the flag (the rewrite off)
is recorded with it.

Stacks (issue 52): parameters that are every row of one stack, in order (``param_stacks``), are
one operand and one output of the node, and so are their momentum buffers (stacked at the first
step, ``MomentsStacked``, as Adam's moments are) and their gradients: separate gradients are
made the rows of a stack the program computes (``stacks.stack_pending``, ``GradsStacked``), so
each ``.grad`` is a view of its row and the program returns one buffer where it returned one per
parameter. The step is elementwise, so the lowering takes a stack as it takes a tensor. A group
whose rows are not all there (a parameter without a gradient) or whose buffers or gradients
cannot be stacked (an alias, a layout) steps its members one by one. Gradients are made rows only
where ``optimizer_state.step_made_rewrites_allowed`` says so (inside a capture: gradients made
in it).

May touch: the tensors the call writes (their new IR), its gradients and buffers (made rows of
stacks: ``stacks``), metrics counters. Records through
``ops``' table (``install``).
"""
from __future__ import annotations

import torch

from .. import lowering
from ..frontend import ops
from . import stacks, state as optimizer_state
from ..run.storage import Storage, scalar_value
from ..frontend.tensor import LazyTensor, reroute

aten = torch.ops.aten
_FUSED = (aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr)


def record(func, info, args, kwargs):
    """``_fused_sgd_`` (and its ``tensor_lr`` form): each written tensor given its new value
    from one node (two when some buffers are a first step's zeros and some are not)."""
    a = ops.bound(info, args, kwargs)
    params, grads, bufs = list(a["self"]), list(a["grads"]), list(a["momentum_buffer_list"])
    momentum = float(a["momentum"])
    if not params:
        return None
    if momentum == 0:
        bufs = [None] * len(params)
    damp = 1 - float(a["dampening"])
    fresh = [b is not None and optimizer_state.undamped_first(b) for b in bufs]
    for first in (True, False):
        ix = [i for i, f in enumerate(fresh) if f is first]
        if ix:
            _record(info, a, [params[i] for i in ix], [grads[i] for i in ix], [bufs[i] for i in ix],
                    1.0 if first else damp)
    return None


def _stacked(params, grads, bufs, first):
    """The call's parameters, gradients and buffers as the step reads them: per item, a tensor
    or the storage of a stack. Parameters that are every row of one stack in order
    (``param_stacks``) are one item, with their buffers' stack (those stacked here first where
    they are device data: ``MomentsStacked``) and their gradients' (made here from separate
    gradients: ``GradsStacked``); where either cannot be, they are items one by one."""
    by, single = {}, []
    for i, p in enumerate(params):
        r = stacks.row_of(p)
        if r is None:
            single.append(i)
        else:
            by.setdefault(id(r[0]), (r[0], r[2], []))[2].append((r[1], i))
    if not by or first:  # (a first step that clones its gradients: the rewrite that avoids it is off)
        return params, grads, bufs
    items = [(i, params[i], grads[i], bufs[i]) for i in single]
    moments = bufs[0] is not None
    aliased = None
    for st, n, got in by.values():
        ix = [i for _, i in got]
        g_st = b_st = None
        if [k for k, _ in got] == list(range(n)):
            gs, bs = [grads[i] for i in ix], [bufs[i] for i in ix]
            g_st = stacks.stack_of(gs)
            b_st = stacks.stack_of(bs) if moments else True
            if (g_st is None or b_st is None) and aliased is None:
                aliased = stacks.aliased([gs, bs] if moments else [gs])
            if b_st is None and optimizer_state.host_rewrites_allowed() and stacks.can_stack(bs, aliased):
                b_st = stacks.stack(bs, "MomentsStacked")
            if g_st is None and b_st is not None and optimizer_state.step_made_rewrites_allowed(gs) \
                    and stacks.can_stack(gs, aliased, pending=True):
                g_st = stacks.stack_pending(gs, "GradsStacked")
        if g_st is None or b_st is None:
            items += [(i, params[i], grads[i], bufs[i]) for i in ix]
        else:
            items.append((ix[0], st, g_st, b_st if moments else bufs[ix[0]]))
    items.sort(key=lambda it: it[0])
    return [it[1] for it in items], [it[2] for it in items], [it[3] for it in items]


def _value(w):
    return w.ir if isinstance(w, Storage) else w._state.value()


def _record(info, a, params, grads, bufs, damp):
    momentum = float(a["momentum"])
    scale, inf = a.get("grad_scale"), a.get("found_inf")
    dtype = params[0].dtype
    lr = a["lr"]
    lr = lr._state.value() if type(lr) is LazyTensor else scalar_value(float(lr), dtype, "_fused_sgd_", "lr")
    first = bool(a["is_first_step"]) and momentum != 0
    params, grads, bufs = _stacked(params, grads, bufs, first)
    written = list(params) + (list(bufs) if momentum != 0 else []) + (list(grads) if scale is not None else [])
    values = [_value(t) for t in params] + [_value(t) for t in grads]
    if momentum != 0 and not first:
        values += [_value(t) for t in bufs]
    values += [lr, scalar_value(damp, dtype, "_fused_sgd_", "dampening")]
    # momentum and weight decay are data, whether they are zero is the program's (a zero one is
    # no operand): a schedule that moves them each step (OneCycleLR cycles SGD's momentum)
    # compiles nothing new
    wd = float(a["weight_decay"])
    values += [scalar_value(v, dtype, "_fused_sgd_", slot) for v, slot in ((momentum, "momentum"),
                                                                           (wd, "weight_decay")) if v != 0]
    values += [t._state.value() for t in (scale, inf) if t is not None]
    metas = tuple(w.meta if isinstance(w, Storage) else w._state.meta for w in written)
    kw = (("n", len(params)), ("weight_decay", wd != 0), ("momentum", momentum != 0),
          ("nesterov", bool(a["nesterov"])), ("maximize", bool(a["maximize"])), ("first", first),
          ("scaled", scale is not None), ("checked", inf is not None))
    node = ops.one_node(info, lowering.lower_fused_sgd, values, kw, metas)
    for i, w in enumerate(written):
        if isinstance(w, Storage):
            w.set_ir((node, i))
        else:
            w._state.write((node, i))


def install() -> None:
    """Record the fused SGD step here (once, by ``import lazyxla``)."""
    for f in _FUSED:
        ops.SPECIAL[f] = record
        reroute(f)
