"""Optimizer step counts kept on the host: one number, and one program input, for every parameter.

torch's fused Adam and AdamW (lazyxla's default for them: ``optimizer_fused``), and the
capturable ones, keep a 0-d step count per parameter on the parameter's device and add one to
all of them (``_foreach_add_(state_steps, 1)``) before the update. Recorded as ops, that is an
add and an output per parameter, and every parameter's update computes its bias corrections
from a count of its own: in a stack of 32 layers (192 parameters) about four of the six kernels
per parameter that XLA compiles, and its HLO passes grow with them.

The counts are numbers the host knows: each begins as data the host sent (zeros at the first
step, ``optimizer_state``; a loaded state dict) and only these adds change it. So a
``_foreach_add_`` of a Python number to a list of 0-d floating tensors whose values the host
knows (not views, no sharding annotation) runs on the host, with PyTorch's CPU kernel in each
tensor's dtype, and each tensor takes its result as a scalar's device data (R1.5, one buffer
per value and dtype). Equal counts are then one input of the program, the fused update computes
the bias corrections once for all of them (``lowering.optim``), and the device adds nothing. The
host knows a value this module gave, and an upload no program has written since (read back once:
the buffer is ready, nothing waits). A list with any other tensor is recorded as before.
Counts ``HostStepCount`` (tensors so updated).

Not for an optimizer built ``capturable=True``: that asks for counts a captured step updates on
the device, so its lazy steps and its captures stay one program. Off where
``optimizer_state.host_rewrites_allowed`` says no (SPMD, several processes, a step or a
torch.compile region being captured: a replay runs the program, not this Python, so there the
counts are the program's outputs; ``before_capture`` gives counts holding a shared buffer
buffers of their own first) and with ``LAZYXLA_HOST_STEP_COUNTS=0``.

May touch: ``ops.SPECIAL`` (one entry), the scalar cache, and the storages of the counts it updates.
"""
from __future__ import annotations

import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from .. import metrics
from ..frontend import ops
from ..run import storage
from ..config import env_flag
from .state import host_rewrites_allowed
from ..frontend.tensor import LazyTensor, reroute
from ..xla.client import download, scalar_array

ENABLED = env_flag("LAZYXLA_HOST_STEP_COUNTS", True)
_FOREACH_ADD = torch.ops.aten._foreach_add_.Scalar

_capturable = False  # while an optimizer built ``capturable`` steps: its counts stay on the device
_value_of: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # count leaf -> its Python value


def _leaf(v, dtype):
    """The shared buffer of the count ``v``: the scalar cache's (R1.5), whose value is kept."""
    leaf = storage.scalar_value(v, dtype, "HostStepCount")[0]
    _value_of[leaf] = v
    return leaf


def _known(tensors):
    """Each tensor's value as a Python number, or None when the host does not know one of them."""
    values, unread = [], []
    for t in tensors:
        if type(t) is not LazyTensor:
            return None
        s = t._state
        st = s.storage
        if (s.chain is not None or st.sharding is not None or st.meta.shape != ()
                or not st.meta.dtype.is_floating_point):
            return None
        v = _value_of.get(st.ir[0])
        if v is None:
            if not storage.from_host(st, st.ir[0]):
                return None
            unread.append(len(values))
        values.append(v)
    if unread:
        hosts = download([tensors[i]._state.storage.data for i in unread],
                         [tensors[i]._state.storage.meta.dtype for i in unread])
        for i, h in zip(unread, hosts):
            values[i] = h.item()
    return values


def _foreach_add(func, info, args, kwargs):
    tensors, other = args[0], args[1]
    values = None
    if (ENABLED and not _capturable and not kwargs and tensors and isinstance(other, (int, float))
            and not isinstance(other, bool) and host_rewrites_allowed()):
        values = _known(tensors)
    if values is None:
        return ops.foreach(func, info, args, kwargs)
    done = {}
    for t, v in zip(tensors, values):
        dt = t._state.storage.meta.dtype
        k = (v, dt)
        leaf = done.get(k)
        if leaf is None:
            leaf = done[k] = _leaf(torch.tensor(v, dtype=dt).add_(other).item(), dt)
        t._state.storage.set_leaf(leaf)
    metrics.counter_inc("HostStepCount", len(tensors))
    return None


def before_capture():
    """A step is about to be captured: every count that holds one of this module's shared
    buffers gets a buffer of its own (the same value), so the capture binds each count as a
    tensor, as every replay will (there the counts are the program's outputs)."""
    for s in storage.live_states():
        st = s.storage
        v = _value_of.get(st.ir[0])
        if v is not None:
            st.set_data(scalar_array(v, st.meta.dtype))


def _pre(opt, args, kwargs):
    global _capturable
    _capturable = any(g.get("capturable") for g in opt.param_groups)


def _post(opt, args, kwargs):
    global _capturable
    _capturable = False


def install() -> None:
    """Route ``_foreach_add_`` of a number here, and hear optimizers step (once, by ``import
    lazyxla``)."""
    ops.SPECIAL[_FOREACH_ADD] = _foreach_add
    reroute(_FOREACH_ADD)
    register_optimizer_step_pre_hook(_pre)
    register_optimizer_step_post_hook(_post)
