"""A ``__torch_dispatch__`` subclass that records nothing: the floor any Python tracer pays.

Each op returns new wrappers of the right shapes and dtypes, found once per signature on the
meta device and cached; in-place ops return their target; in-place ``_foreach_`` ops return
None. Its tensors live on the meta device, so PyTorch's autograd runs their backward in the
calling thread, as lazyxla's.
"""
from __future__ import annotations

import torch


class Bare(torch.Tensor):
    """Records nothing: each op returns new wrappers of the right shapes (found once per
    signature on the meta device); in-place ops return their target."""

    _outs: dict = {}
    _inplace: dict = {}

    @staticmethod
    def __new__(cls, shape, dtype, requires_grad=False):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device="meta",
                                                   requires_grad=requires_grad)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kind = cls._inplace.get(func)
        if kind is None:
            sch = func._schema
            kind = cls._inplace[func] = (
                "foreach" if sch.name.startswith("aten::_foreach_") and sch.name.endswith("_") else
                "inplace" if sch.arguments and sch.arguments[0].alias_info is not None
                and sch.arguments[0].alias_info.is_write else "new")
        if kind == "foreach":
            return None
        if kind == "inplace":
            return args[0]
        key = (func, *map(Bare._key, args))
        metas = cls._outs.get(key)
        if metas is None:
            def meta(a):
                if isinstance(a, torch.Tensor):
                    return torch.empty(a.shape, dtype=a.dtype, device="meta")
                if isinstance(a, (list, tuple)):
                    return type(a)(meta(t) for t in a)
                return a
            out = func(*meta(list(args)), **{k: meta(v) for k, v in (kwargs or {}).items()})
            metas = cls._outs[key] = out
        return Bare._wrap(metas)

    @staticmethod
    def _key(a):
        if isinstance(a, torch.Tensor):
            return a.shape, a.dtype
        if isinstance(a, (list, tuple)):
            return tuple(map(Bare._key, a))
        return a

    @staticmethod
    def _wrap(o):
        if isinstance(o, torch.Tensor):
            return Bare(o.shape, o.dtype)
        if isinstance(o, (list, tuple)):
            return type(o)(Bare._wrap(t) for t in o)
        return o
