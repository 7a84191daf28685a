"""Ops with handling of their own, PyTorch decompositions, and the CPU fallback (R1.7).

The warm path (``tensor.py``) records most ops as IR nodes. The ops here cannot be, or need
more than that:

- aliases (``detach``, ``alias``), reads (``_local_scalar_dense``: ``.item()``), transfers and
  casts (``_to_copy``), copies (``copy_``), ``set_``, ``resize_``, in-place view ops (``t_``,
  ``transpose_``, ``unsqueeze_``, ``squeeze_``, ``as_strided_``), ``_foreach_*`` lists (``SPECIAL``,
  ``special_for``; the fused Adam/AdamW steps are ``optimizer_stacks``' entries in it);
- an op without a lowering that PyTorch can decompose into others (``decompose``);
- an op with neither: it runs on the CPU with its inputs read, and the results are uploaded,
  counted as ``aten::<op>`` (``fallback``).

Each takes ``(func, info, args, kwargs)`` with the caller's torch tensors, and answers with
what the op returns, where a new lazy tensor is given as its ``storage.TensorState`` (the
caller wraps it), or with ``Record(args, kwargs)``: record this call as an ordinary op.
A lazy tensor reaches its value through its ``_state``.

May touch: lazy tensors' states, storages, metrics counters; runs value reads through the
executor.
"""
from __future__ import annotations

import torch

from .. import lowering, metrics
from .device import BACKEND, DEVICE, is_lazy
from ..engine.executor import read_values
from ..ir.node import Node, OpSig, Slot
from ..ir.user_line import fmt_where, user_frame, user_site
from ..errors import LazyXlaError
from .signature import check_writable, describe, flat_tensors
from ..run.storage import converted, upload

aten = torch.ops.aten


class Record:
    """A special op's answer: record the call as an ordinary op, with these arguments (a
    ``TensorState`` among them stands for a new lazy tensor)."""

    __slots__ = ("args", "kwargs")

    def __init__(self, args, kwargs):
        self.args = args
        self.kwargs = kwargs


# PyTorch's C++ ``Tensor.data`` setter: a shallow copy of sizes, strides and dtype between two
# lazy tensors (it keeps the target's autograd identity and version counter).
_set_metadata = torch._C.TensorBase.data.__set__


def become(t, new):
    """``t`` takes ``new``'s shape, strides, dtype and value in place, as an alias of its
    storage (``.data = ``, ``set_``, ``resize_``, ``t_``, ``unsqueeze_`` ...)."""
    _set_metadata(t, new)
    t._state.become(new._state)


# ---------------------------------------------------------------------------------------
def _identity_alias(func, info, args, kwargs):
    return args[0]._state.alias()


def _local_scalar_dense(func, info, args, kwargs):
    metrics.counter_inc("aten::_local_scalar_dense")
    return read_values([args[0]._state])[0].item()


def _to_copy(func, info, args, kwargs):
    """``.to(...)``: to another device is a value read; a dtype change is recorded."""
    src = args[0]
    dev = kwargs.get("device")
    if dev is not None and torch.device(dev).type != BACKEND:
        host = read_values([src._state])[0]
        if kwargs.get("dtype") is not None and kwargs["dtype"] != host.dtype:
            host = host.to(kwargs["dtype"])
        if torch.device(dev).type != "cpu":
            host = host.to(dev)
        return host.pin_memory() if kwargs.get("pin_memory") else host
    return Record((src,), {"dtype": kwargs["dtype"]} if kwargs.get("dtype") is not None else {})


def _copy_(func, info, args, kwargs):
    dst, src = args[0], args[1]
    if not is_lazy(dst):
        dst.copy_(read_values([src._state])[0])
        return dst
    if 0 in dst.stride():
        check_writable(dst, "aten::copy_", user_frame(1))
    lazy_src = is_lazy(src)
    s = src._state if lazy_src else upload(src)
    d = dst._state
    if s.meta.shape == d.meta.shape and s.meta.dtype == d.meta.dtype:
        d.write(s.value())
        return dst
    return Record((dst, src if lazy_src else s), {})  # broadcast and/or convert: recorded as aten::copy


def _lift(func, info, args, kwargs):
    return args[0]


def _set(func, info, args, kwargs):
    """``t.set_(src)``: t becomes an alias of src, with src's shape and dtype."""
    t = args[0]
    src = args[1] if len(args) > 1 else kwargs.get("source")
    if is_lazy(src):
        become(t, src)
        return t
    raise LazyXlaError(f"{info.name}: lazyxla can only make a tensor an alias of another lazy tensor "
                       f"(got {describe(src)}) at {fmt_where(user_frame(1))}")


def _inplace_view(func, info, args, kwargs):
    """The tensor itself becomes the view (same storage, new shape and strides), as in PyTorch."""
    t = args[0]
    become(t, info.functional(*args, **kwargs))
    return t


def _resize(func, info, args, kwargs):
    """``resize_``: the first elements are kept (in row-major order) and new ones are zero
    (PyTorch leaves them uninitialized); the tensor gets a storage of its own."""
    t, size = args[0], tuple(args[1])
    if size == tuple(t.shape):
        return t
    if t._state.chain:
        raise LazyXlaError(f"{info.name}: lazyxla cannot resize a view ({list(t.shape)} -> {list(size)}) "
                           f"at {fmt_where(user_frame(1))}; resize the tensor it views, or make a new tensor")
    n = 1
    for d in size:
        n *= d
    with torch.no_grad():
        flat = aten.reshape.default(t, [-1])
        have = flat.shape[0]
        if n <= have:
            flat = aten.slice.Tensor(flat, 0, 0, n)
        else:
            flat = aten.cat.default([flat, aten.zeros.default([n - have], dtype=t.dtype, device=DEVICE)])
        become(t, aten.clone.default(aten.reshape.default(flat, list(size))))
    return t


def _resize_as(func, info, args, kwargs):
    return _resize(func, info, (args[0], list(args[1].shape)), {})


def foreach(func, info, args, kwargs):
    """``_foreach_<op>[_]``: the same op on each element of the lists, recorded one by one."""
    name = func._schema.name.split("::")[1][len("_foreach_"):]
    single = getattr(aten, name)
    n = next(len(a) for a in args if isinstance(a, (list, tuple)))
    per = [isinstance(a, (list, tuple)) and len(a) == n for a in args]
    if name in ("addcdiv_", "addcmul_", "addcdiv", "addcmul") and len(args) == 4:
        vals = args[3]
        args, per = args[:3], per[:3]
        kws = [dict(kwargs, value=(vals[i].item() if isinstance(vals, torch.Tensor) else vals[i])
                    if per_v else vals) for i, per_v in ((i, isinstance(vals, (list, tuple, torch.Tensor)))
                                                         for i in range(n))]
    else:
        kws = [kwargs] * n
    res = [single(*[a[i] if p else a for a, p in zip(args, per)], **kws[i]) for i in range(n)]
    return None if name.endswith("_") else res


_NODE_SIGS: dict = {}


def bound(info, args, kwargs) -> dict:
    """A special op's arguments by their schema names."""
    a = dict(zip(info.arg_names, args))
    a.update(kwargs)
    return a


def one_node(info, lower, values, kw: tuple, metas: tuple) -> Node:
    """A special op's call recorded as one node of its own signature: ``info``'s op lowered by
    ``lower(sig, *values, **dict(kw))`` with outputs ``metas``; the signature made once per
    operand metas and settings, the call counted (``info.counter``), the node's line the first
    frame out of lazyxla and torch."""
    k = (info.name, metas, tuple(v[0].sig.outs[v[1]] for v in values), kw)
    sig = _NODE_SIGS.get(k)
    if sig is None:
        sig = _NODE_SIGS[k] = OpSig(info.name, None, lower, (tuple(Slot(i) for i in range(len(values))), kw), metas)
    metrics.counter_inc(info.counter)
    return Node(sig, tuple(values), user_site(2))


SPECIAL = {
    aten.detach.default: _identity_alias,
    aten.alias.default: _identity_alias,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten._to_copy.default: _to_copy,
    aten.copy_.default: _copy_,
    aten.lift_fresh.default: _lift,
    aten.resize_.default: _resize,
    aten.resize_as_.default: _resize_as,
    aten.set_.source_Tensor: _set,
}


def special_for(func, info):
    """The handling of its own that ``func`` needs, or None (recorded by the warm path)."""
    s = SPECIAL.get(func)
    if s is None and info.name.startswith("aten::_foreach_"):
        s = foreach
    if s is None and info.inplace_view:
        s = _inplace_view
    if s is None and info.kind in ("inplace", "out") and info.functional not in (None, func):
        s = _with_defaults(func, info.functional)
    return s


def _with_defaults(func, functional):
    """PyTorch leaves out trailing arguments equal to their defaults when it dispatches, and some
    in-place ops have defaults their functional form lacks (``bernoulli_.float``'s ``p=0.5``,
    ``bernoulli.p`` has none): a special that puts them back, or None when nothing is missing."""
    required = {a.name for a in functional._schema.arguments if not a.has_default_value()}
    args = func._schema.arguments
    fill = [(i, a) for i, a in enumerate(args) if a.has_default_value() and a.name in required]
    if not fill:
        return None
    last = max((i for i, a in fill if not a.kwarg_only), default=-1)
    positional = [a.default_value for a in args[:last + 1]]
    kw_fill = {a.name: a.default_value for _, a in fill if a.kwarg_only}

    def special(func, info, a, kw):
        if len(a) <= last:
            a = tuple(a) + tuple(positional[len(a):])
        if kw_fill:
            kw = {**kw_fill, **kw}
        return Record(a, kw)
    return special


# ---------------------------------------------------------------------------------------
def decompose(func, info, args, kwargs):
    """Record the op through a PyTorch decomposition; one that declines (returns
    NotImplemented, as PyTorch's do for cases they do not cover) sends the op to the CPU."""
    fn = lowering.DECOMPOSITIONS[info.functional]
    kw = dict(kwargs or {})
    outs = [kw.pop(w) for w in info.written] if info.kind == "out" else None
    r = fn(*args, **kw)
    if r is NotImplemented:
        return fallback(func, info, args, kwargs)
    if info.kind in ("functional", "mutating"):  # a mutating op's decomposition writes itself
        return r
    if info.kind == "out":
        rs = r if isinstance(r, (tuple, list)) else (r,)
        for o, v in zip(outs, rs):
            o.copy_(v)
        return outs[0] if len(outs) == 1 else tuple(outs)
    args[0].copy_(r)
    return args[0]


def fallback(func, info, args, kwargs):
    """R1.7: run the op on the CPU with its inputs read, upload the results."""
    metrics.counter_inc("aten::" + info.name.split("::", 1)[-1].split(".")[0])
    lazies = [t for t in flat_tensors([args, list((kwargs or {}).values())], []) if is_lazy(t)]
    hosts = read_values([t._state for t in lazies]) if lazies else []
    table = {id(t): h for t, h in zip(lazies, hosts)}

    def to_host(a):
        if id(a) in table:
            return table[id(a)]
        if isinstance(a, (list, tuple)):
            return type(a)(to_host(x) for x in a)
        if isinstance(a, torch.device) and a.type == BACKEND:
            return torch.device("cpu")
        return a

    r = func(*to_host(list(args)), **{k: to_host(v) for k, v in (kwargs or {}).items()})
    if info.written:  # the CPU changed the host copies of the written tensors: upload them back
        for a in _written_tensors(func, info, args, kwargs):
            up = upload(table[id(a)])
            a._state.write(converted(up.value(), up.meta, a._state.meta))
        if info.kind == "inplace":
            return args[0]

    def back(x):
        if isinstance(x, torch.Tensor):
            for a in lazies:
                if table[id(a)] is x:
                    return a
            up = upload(x)
            if info.view:  # PyTorch's result aliases an input; ours is a copy: writes to it are refused
                up.copy_of_view = info.name
            return up
        if isinstance(x, (list, tuple)):
            return type(x)(back(y) for y in x)
        return x

    return back(r)


def _written_tensors(func, info, args, kwargs):
    """The lazy tensors passed in the arguments the op's schema marks as written."""
    out = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.name not in info.written:
            continue
        v = args[i] if i < len(args) else (kwargs or {}).get(arg.name)
        out += [t for t in flat_tensors(v, []) if is_lazy(t)]
    return out
