"""Value reads answered on the host: a small graph over data the host just sent, without a program.

A value read (R5) compiles its graph (once per shape) and waits for the device. When every
parameter of the read's graph is data uploaded from the host during this step, or a Python
scalar made device data (R1.5), nothing on the device is needed: those buffers hold what the
host sent, ready at once. Such a graph, if it is small (``MAX_OPS`` ops, ``MAX_BYTES`` of
inputs), made only of ATen ops that are not random, and of a structure whose sizes vary (seen
before with other sizes: ``dynamic.observe``; it would compile again for every size), runs
in PyTorch eager on copies of those inputs, and the read returns its values: no compile, no
wait for the device, the same values (PyTorch's own kernels, on the values the device holds).
Such reads: a check of a batch's attention mask at every padded length (transformers' own
``padding_mask.all()`` no longer reads from lazy tensors: ``hf_masks``). A read of fixed shapes
keeps R5 exactly (its own program, compiled once, under its own key).

``answer(graph)`` returns one CPU tensor per root, or None when the read needs the device.
``LAZYXLA_HOST_READS=0`` turns it off. Counts ``HostAnsweredRead``.

May touch: nothing but the CPU tensors it makes (and the counter); reads storages' upload step
and tells ``dynamic`` the read's sizes.
"""
from __future__ import annotations

import jax
import torch

from .. import metrics
from ..config import env_flag
from ..ir.node import OpSig
from ..lowering import is_random
from ..lowering.program import instantiate
from ..dynamic import observe
from ..run.storage import uploaded_this_step
from ..xla.client import download

_CPU = torch.device("cpu")
ENABLED = env_flag("LAZYXLA_HOST_READS", True)
MAX_OPS = 64
MAX_BYTES = 1 << 20


def _leaf_ok(leaf) -> bool:
    if leaf.owner is None:
        # a Python scalar made device data (R1.5): a 0-d buffer, sent by the host, ready
        a = leaf.data
        return leaf.sig.outs[0].shape == () and isinstance(a, jax.Array) and a.is_ready()
    st = leaf.owner()
    return st is not None and uploaded_this_step(st, leaf)


def answer(graph):
    """The roots' values computed on the host (CPU tensors, one per root), or None."""
    if not ENABLED:
        return None
    if not 0 < len(graph.post) - len(graph.params) <= MAX_OPS:  # checked before any walk: reads run every step
        return None
    ops = [n for n in graph.post if n.data is None]
    size = 0
    for p in graph.params:
        m = p.sig.outs[0]
        size += m.numel * m.dtype.itemsize
        if size > MAX_BYTES or not _leaf_ok(p):
            return None
    for n in ops:
        f = n.sig.func
        if n.sig.op == "lazyxla::convert":
            continue
        if not isinstance(f, torch._ops.OpOverload) or is_random(f) or f._schema.is_mutable or \
                type(n.sig) is not OpSig:
            return None
    if not observe(graph):  # fixed shapes: R5's own program, compiled once
        return None
    try:
        hosts = download([p.data for p in graph.params], [p.sig.outs[0].dtype for p in graph.params])
    except Exception:  # noqa: BLE001 - not ready or not addressable here: the device answers
        return None
    env = {id(p): (h,) for p, h in zip(graph.params, hosts)}
    try:
        for n in ops:
            vals = [env[id(o)][i] for o, i in n.operands]
            env[id(n)] = run_op(n.sig, vals)
    except Exception:  # noqa: BLE001 - whatever eager refuses, the program does (with its own error)
        return None
    metrics.counter_inc("HostAnsweredRead")
    out = [env[id(r)][i] for r, i in graph.roots]
    return [x.clone() if x._base is not None else x for x in out]


_NUMBERS = ("number", "Scalar", "float", "int", "bool", "complex", "SymInt")
_NUMBER_ARGS: dict = {}  # op -> (positions, names) of its arguments that are numbers, not tensors


def _number_args(func):
    got = _NUMBER_ARGS.get(func)
    if got is None:
        args = func._schema.arguments
        want = [str(a.type).removeprefix("Optional[").removesuffix("]").rstrip("?") in _NUMBERS for a in args]
        got = _NUMBER_ARGS[func] = ({i for i, w in enumerate(want) if w}, {a.name for a, w in zip(args, want) if w})
    return got


def run_op(sig, vals):
    """One recorded op run in PyTorch eager on CPU tensors (its operands' values, in order):
    its outputs, checked against the recorded shapes and dtypes (a ValueError otherwise)."""
    if sig.op == "lazyxla::convert":
        m = sig.outs[0]
        return (vals[0].to(m.dtype).expand(m.shape).clone(),)
    targs, tkw = sig.template
    kw = {k: (_CPU if k == "device" and v is not None else instantiate(v, vals)) for k, v in tkw}
    args = instantiate(targs, vals)
    # a Python scalar the trace made device data (R1.5) is a number again where ATen wants one
    at, names = _number_args(sig.func)
    args = [a.item() if i in at and isinstance(a, torch.Tensor) else a for i, a in enumerate(args)]
    kw = {k: (a.item() if k in names and isinstance(a, torch.Tensor) else a) for k, a in kw.items()}
    out = sig.func(*args, **kw)
    if any(isinstance(o, torch.Tensor) and o.device.type != "cpu" for o in (out if isinstance(out, (tuple, list))
                                                                           else (out,))):
        raise ValueError("made a tensor off the host")
    outs = tuple(_physical(o) for o in out) if isinstance(out, (tuple, list)) else (_physical(out),)
    for o, m in zip(outs, sig.outs):
        if tuple(o.shape) != m.shape or o.dtype != m.dtype:
            raise ValueError("not the recorded shape or dtype")
    return outs


def _physical(o):
    """A conjugate or negative view (eager's ``_conj``, ``_neg_view``: a bit on the tensor, not
    its values) made values, as the op's lowering makes them: the next op reads memory that
    holds what the device's buffer would (eager's kernels do not all honor the bits; ``_fft_c2r``
    reads a conjugate view's memory as it is)."""
    if isinstance(o, torch.Tensor) and (o.is_conj() or o.is_neg()):
        return o.resolve_conj().resolve_neg()
    return o
