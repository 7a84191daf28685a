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
| weight_decay, momentum, nesterov, maximize | the signature's settings                       |
| grad_scale, found_inf                      | operands, when given                           |
| ``is_first_step``                          | never true here (below)                        |

PyTorch's first step (no buffers yet) passes ``is_first_step``: the buffer becomes the gradient.
``optimizer_state`` gives such a step zero buffers first, so the flag is off and the steady
step's formula runs, ``buf * momentum + grad * (1 - dampening)``, with the factor 1 for those
buffers: the gradient, exactly, and one graph for every step. A call whose buffers are partly
fresh and partly not is recorded as two nodes. A call that does pass the flag (the rewrite off)
is recorded with it.

May touch: the tensors the call writes (their new IR), metrics counters. Records through
``ops``' table (``install``).
"""
from __future__ import annotations

import torch

from .. import lowering
from ..frontend import ops
from . import state as optimizer_state
from ..run.storage import scalar_value
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


def _record(info, a, params, grads, bufs, damp):
    momentum = float(a["momentum"])
    scale, inf = a.get("grad_scale"), a.get("found_inf")
    dtype = params[0].dtype
    lr = a["lr"]
    lr = lr._state.value() if type(lr) is LazyTensor else scalar_value(float(lr), dtype, "_fused_sgd_", "lr")
    first = bool(a["is_first_step"]) and momentum != 0
    written = list(params) + (list(bufs) if momentum != 0 else []) + (list(grads) if scale is not None else [])
    values = [t._state.value() for t in params] + [t._state.value() for t in grads]
    if momentum != 0 and not first:
        values += [t._state.value() for t in bufs]
    values += [lr, scalar_value(damp, dtype, "_fused_sgd_", "dampening")]
    values += [t._state.value() for t in (scale, inf) if t is not None]
    metas = tuple(w._state.meta for w in written)
    kw = (("n", len(params)), ("weight_decay", float(a["weight_decay"])), ("momentum", momentum),
          ("nesterov", bool(a["nesterov"])), ("maximize", bool(a["maximize"])), ("first", first),
          ("scaled", scale is not None), ("checked", inf is not None))
    node = ops.one_node(info, lowering.lower_fused_sgd, values, kw, metas)
    for i, w in enumerate(written):
        w._state.write((node, i))


def install() -> None:
    """Record the fused SGD step here (once, by ``import lazyxla``)."""
    for f in _FUSED:
        ops.SPECIAL[f] = record
        reroute(f)
