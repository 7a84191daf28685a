"""Batch norm in training recorded as one node that also writes the running statistics.

``native_batch_norm`` in training mode normalizes by the batch's statistics and updates the
running mean and variance in place. PyTorch's decomposition of it traced some twenty ops per
call on the host, every step (ResNet-18: 20 calls a step, most of its forward's tracing). Here
such a call is one node (``lowering.lower_batch_norm_train``) with five outputs: the output,
the saved mean and inverse std (the dtypes of PyTorch's CPU kernel), and the new running mean
and variance, which become the running statistics' values. Its backward was one node already.

| the call                                                   | recorded as                     |
|------------------------------------------------------------|---------------------------------|
| training, running mean and variance given, every tensor     | one node (the momentum as data: |
| lazy, more than one value per channel                       | ``momentum=None`` changes it)   |
| anything else (evaluation, no running statistics, ...)      | PyTorch's decomposition         |

May touch: the running statistics' IR (and, through ``ops.one_node``, its counter). Records through ``ops``' table
(``install``).
"""
from __future__ import annotations

import torch

from .. import lowering
from ..frontend import ops
from ..ir.node import TensorMeta
from ..lowering.layer_norm import stats_dtype
from ..run.storage import fresh, scalar_value
from ..frontend.tensor import LazyTensor, reroute

aten = torch.ops.aten
_OP = aten.native_batch_norm.default


def record(func, info, args, kwargs):
    """``native_batch_norm``: one node where the table above says so, else recorded as usual."""
    a = ops.bound(info, args, kwargs)
    x, weight, bias, mean, var = (a.get(k) for k in ("input", "weight", "bias", "running_mean", "running_var"))
    lazy = all(isinstance(t, LazyTensor) for t in (x, mean, var)) and \
        all(t is None or isinstance(t, LazyTensor) for t in (weight, bias))
    if not (a.get("training") and lazy and x.dim() >= 2 and x.numel() > x.shape[1]):
        return ops.Record(args, kwargs)
    values = [x._state.value()] + [t._state.value() for t in (weight, bias) if t is not None]
    values += [mean._state.value(), var._state.value(),
               scalar_value(float(a["momentum"]), mean.dtype, "native_batch_norm", "momentum")]
    c = x.shape[1]
    sd = stats_dtype(x, weight, bias, mean, var)
    metas = (x._state.meta, TensorMeta((c,), sd), TensorMeta((c,), sd),
             mean._state.meta, var._state.meta)
    kw = (("has_weight", weight is not None), ("has_bias", bias is not None), ("eps", float(a["eps"])))
    node = ops.one_node(info, lowering.lower_batch_norm_train, values, kw, metas)
    mean._state.write((node, 3))
    var._state.write((node, 4))
    return tuple(fresh((node, i), metas[i]) for i in range(3))


def install() -> None:
    """Record training batch norm here (once, by ``import lazyxla``)."""
    ops.SPECIAL[_OP] = record
    reroute(_OP)
