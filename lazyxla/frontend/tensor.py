"""Lazy tensors: the torch-facing face, and the warm path from a torch op to an IR node.

A ``LazyTensor`` is a ``torch.Tensor`` wrapper subclass on the ``lazyxla`` device (PyTorch's
PrivateUse1 backend, renamed). It holds no numbers: its value is its ``_state`` (a
``storage.TensorState``: storage, view chain, meta, id). Every ATen call that involves a
lazy tensor reaches ``__torch_dispatch__`` and so ``dispatch``:

1. an op with handling of its own goes to ``ops`` (aliases, reads, copies, resizes, ...);
2. otherwise the call's signature key is built from the op, each tensor's interned meta and
   each non-tensor argument (a Python scalar that is an op value enters only by kind, unless
   it is 0, 1 or -1: R1.5), collecting the operands on the way; the key finds the
   ``signature.Entry`` (made once per key by ``signature.new_entry``, the cold path); an out=
   op PyTorch refuses to write over its inputs is checked for that on every call
   (``checks.check_overlap``: which storage a tensor is in is not in the key);
3. by the op's schema: a functional op gets new storages for its outputs; a view op's
   outputs share the input's storage and extend its view chain; an in-place op writes the
   new value into its target's storage (through a view: scattered back into the storage);
   an op without a lowering decomposes or runs on the CPU (``ops``).

Reading a value (``repr``, ``.item()``, ``.cpu()``, ...) is one ``executor.read_values``.
May touch: lazy tensors and their states, the RNG chain, the tracing metrics.
"""
from __future__ import annotations

import copy
import warnings

import torch

from ..engine import eager
from .. import metrics
from ..ir import rng
from .checks import check_overlap
from .device import DEVICE
from ..engine.executor import read_values
from ..ir.node import Node, OpSig
from ..ir.user_line import fmt_where, user_frame, user_site
from .ops import Record, become, decompose, fallback, special_for
from ..errors import LazyXlaError
from .signature import SCALAR_TYPES, SPECIAL_SCALARS, AsData, is_special, new_entry, op_info
from ..run.storage import SCALAR_LEAVES, TensorState, converted, fresh, scalar_value, storage_offset, upload

aten = torch.ops.aten
_now = metrics.now_ns
_COUNTERS = metrics.COUNTERS
TRACE_NS = metrics.pending_samples("LazyTracing", "time")  # per-op tracing time
_make_wrapper = torch.Tensor._make_wrapper_subclass
_STRIDED = torch.strided


class DeviceStorage(torch.UntypedStorage):
    """A lazy tensor's storage as PyTorch code sees it: a meta storage of the buffer's size
    (no host memory) whose ``data_ptr()`` is a device address of its own: from 2**56 up, above
    any host address, never reused, each storage's range apart from the others'."""

    _next = [1 << 56]

    @classmethod
    def make(cls, nbytes):
        u = cls(nbytes, device="meta")
        u._address = cls._next[0]
        cls._next[0] += (nbytes // 64 + 2) * 64
        return u

    def data_ptr(self):
        return self._address


class LazyTensor(torch.Tensor):
    """A tensor on the lazy XLA device; see the module docstring."""

    __slots__ = ("_state",)

    @staticmethod
    def __new__(cls, state: TensorState, requires_grad=False):
        return _tensor(state, requires_grad)

    def __init__(self, *a, **k):
        pass

    __torch_function__ = torch._C._disabled_torch_function_impl
    __hash__ = object.__hash__  # by identity, as torch.Tensor's, without a Python call

    # __torch_dispatch__ is ``dispatch`` itself (set below it): one Python frame less per op

    # -- values read on the host (R5); each is one value read -------------------------------
    def __repr__(self, *, tensor_contents=None):
        body = repr(read_values([self._state])[0])
        if body.endswith(")"):
            body = body[:-1] + f", device='{self.device}')"
        return body

    @property
    def data(self):
        """An alias sharing this tensor's value, outside autograd (as ``Tensor.data``)."""
        return LazyTensor(self._state.alias())

    @data.setter
    def data(self, new):
        if not isinstance(new, LazyTensor):
            raise RuntimeError(f"lazyxla: .data of a tensor on {DEVICE} can only be set to another tensor on "
                               f"{DEVICE}, got one on {getattr(new, 'device', type(new).__name__)}")
        become(self, new)

    def __format__(self, spec):
        # f"{loss:.4f}": a 0-d tensor formats as its number, as torch.Tensor does for its own type
        if self.dim() == 0:
            return self.item().__format__(spec)
        return object.__format__(self, spec)

    def tolist(self):
        return self.cpu().tolist()

    def numpy(self, *, force=False):
        return self.cpu().numpy()

    def untyped_storage(self):
        """What code that compares storages sees: one meta storage per lazyxla storage (a
        tensor and its aliases and views share it), of the storage's size, with a device
        address of its own (``DeviceStorage``): no host memory, as a GPU tensor's. safetensors
        and HuggingFace's ``save_pretrained`` tell shared tensors apart by (address, size): with
        one address for all, every two tensors of one size looked tied. A row of a stack
        (``stacks``: parameters and moments kept as rows of one buffer) shows a storage of its
        own, as the separate tensor the user made. PyTorch's own storage of a wrapper tensor
        refuses its pointer."""
        s = self._state
        st = s.storage
        u = st.untyped
        if u is None:
            m = st.meta
            u = st.untyped = DeviceStorage.make(m.numel * m.dtype.itemsize)
        if type(u) is dict:  # a stack's: each row's own, made when first asked (None until then)
            k = id(s.chain) if id(s.chain) in u else None
            row = u[k]
            if row is None:
                m = s.meta if k is not None else st.meta
                row = u[k] = DeviceStorage.make(m.numel * m.dtype.itemsize)
            return row
        return u

    def data_ptr(self):
        return self.untyped_storage().data_ptr()

    def __reduce_ex__(self, proto):
        # torch.save: the value (one value read) and where it goes back to; loadable with
        # torch.load(weights_only=True) once lazyxla is imported.
        host = self.detach().cpu()
        return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
                (host, self.dtype, str(self.device), self.requires_grad))

    def __deepcopy__(self, memo):
        """copy.deepcopy: a recorded clone (new storage), with the tensor's Python attributes."""
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():
            r = self.clone()
        r.requires_grad_(self.requires_grad)
        for k, v in getattr(self, "__dict__", {}).items():
            setattr(r, k, copy.deepcopy(v, memo))
        memo[id(self)] = r
        return r


def to_device(host: torch.Tensor) -> LazyTensor:
    """Upload a CPU tensor: device data at once, no IR (TransferToDeviceTime)."""
    return LazyTensor(upload(host))


def wrap(x):
    """A special op's answer as PyTorch wants it: each TensorState becomes a new LazyTensor."""
    t = type(x)
    if t is TensorState:
        return _tensor(x)
    if t is list or t is tuple:
        return t(wrap(y) for y in x)
    return x


# ---------------------------------------------------------------------------------------
# The warm path. Every recorded op comes through here, so it is written for speed: routes
# and signatures are found by identity (an OpOverload hashes in Python), a new tensor is
# made without a Python-level constructor call, and the user's line is captured as a site
# (code object, bytecode offset) that becomes a line only when someone reads it.
_ROUTES: dict = {}  # id(op) -> (op, its schema facts, its handling of its own or None)


def reroute(func) -> None:
    """``func``'s route is found again at its next call (``ops.SPECIAL`` changed for it)."""
    _ROUTES.pop(id(func), None)


def _route(func):
    i = op_info(func)
    r = _ROUTES[id(func)] = (func, i, special_for(func, i))
    return r


def dispatch(cls, func, types, args=(), kwargs=None):
    """``LazyTensor.__torch_dispatch__``: one ATen call on lazy tensors, recorded as an IR node
    (or handled by ``ops``, decomposed, or run on the CPU). One function, so that the common
    case is one Python frame: find the route, build the signature key, find its entry, make
    the node and the output tensors."""
    t0 = _now()
    r = _ROUTES.get(id(func))
    if r is None or r[0] is not func:
        r = _route(func)
    _, info, special = r
    if special is not None:
        out = special(func, info, args, kwargs or {})
        t = type(out)
        if t is not Record:  # an alias (detach, as AccumulateGrad does per parameter): one new tensor
            return _done(_tensor(out) if t is TensorState else wrap(out))
        args, kwargs = wrap(out.args), out.kwargs
    # the signature key (the op, by its schema facts; each tensor's meta; each non-tensor
    # argument), collecting the operands: a tensor's IR value, or a Python scalar op value
    ops = []
    key = [info]
    vp = info.value_pos
    for i, a in enumerate(args):
        t = type(a)
        if t is LazyTensor:  # the common cases, inline
            s = a._state
            ops.append(s.storage.ir if s.chain is None else s.value())
            key.append(s.meta)
        elif (t is float or t is int) and i in vp and a not in SPECIAL_SCALARS:
            ops.append(a)
            key.append(_SCALAR_KEYS[t])
        else:
            key.append(_key_item(a, i in vp, ops, info))
    if kwargs:
        vk = info.value_kw
        for k, a in kwargs.items():
            key.append(k)
            key.append(_key_item(a, k in vk, ops, info))
    key = tuple(key)
    entry = _SIGS.get(key)
    if entry is None:
        entry = _SIGS[key] = new_entry(func, info, args, kwargs, user_frame(2))
    if info.overlap is not None:  # an out= op: does out= share elements with an input?
        check_overlap(info.overlap, info, entry.sig, args, kwargs)
    if entry.mode != "node":
        return _done(_without_node(entry, func, info, args, kwargs))
    c = info.counter
    _COUNTERS[c] = _COUNTERS.get(c, 0) + 1
    sig = entry.sig
    sdt = entry.scalar_dtypes  # operand index -> dtype of each Python scalar operand
    if sdt:
        for j, dt in sdt.items():
            v = ops[j]
            if type(v) is not tuple:
                leaf = SCALAR_LEAVES.get((type(v), v, dt, c, j))
                ops[j] = leaf if leaf is not None else scalar_value(v, dt, c, j)
    vals = tuple(ops)
    if info.random:
        vals += (rng.next_seed(),)
    kind = info.kind
    from_storage = False
    if func is _AS_STRIDED and kind == "view":
        sig, vals, from_storage = _as_strided_on_storage(args, kwargs, sig, vals)
    node = Node(sig, vals, user_site(2))  # dispatch's caller, or the first user frame out of it
    if kind == "functional":
        if entry.returns == "one":
            out = _tensor(fresh((node, 0), sig.outs[0]))
        else:
            out = _as_returned([_tensor(fresh((node, i), m)) for i, m in enumerate(sig.outs)], entry.returns)
        if entry.pattern is not None:
            it = iter(out)
            out = tuple(next(it) if p else None for p in entry.pattern)
    elif kind == "inplace":
        out = args[0]
        out._state.write((node, 0))
    elif kind == "view":
        out = _as_returned([_tensor(s) for s in args[0]._state.view(node, sig, from_storage)], entry.returns)
    elif kind == "out":
        out = _write_out(node, sig, info, kwargs)
    else:
        raise LazyXlaError(f"{info.name}: mutating op without a lowering at {fmt_where(node.where)}")
    TRACE_NS.append(_now() - t0)
    if eager.ON:
        eager.after_op(out)
    return out


LazyTensor.__torch_dispatch__ = classmethod(dispatch)


def _done(out):
    """An op's result that took one of the rarer ways (handled by ``ops``, decomposed, a
    constant, the CPU): computed now in eager mode, as a recorded one is."""
    if eager.ON:
        eager.after_op(out)
    return out


def _without_node(entry, func, info, args, kwargs):
    """A call whose signature records no node: a constant, a decomposition, PyTorch's own
    composite, or the CPU fallback."""
    mode = entry.mode
    if mode == "const":
        return entry.const
    if mode == "decomp":
        return wrap(decompose(func, info, args, kwargs))
    if mode == "implicit":
        return func.decompose(*args, **(kwargs or {}))
    return wrap(fallback(func, info, args, kwargs))


def _tensor(state, requires_grad=False):
    """A new LazyTensor for ``state``, without a Python constructor call. Arguments by position
    (size, strides, offset, memory format, dtype, layout, device, pin_memory, requires_grad):
    PyTorch parses keywords slower; no strides for a contiguous tensor (PyTorch's default)."""
    m = state.meta
    t = _make_wrapper(LazyTensor, m.shape, None if m.contiguous else m.stride, None, None, m.dtype, _STRIDED,
                      DEVICE, False, requires_grad)
    t._state = state
    return t


_SIGS: dict = {}  # signature key -> signature.Entry
_AS_STRIDED = aten.as_strided.default


_OFFSET_SIGS: dict = {}


def _as_strided_on_storage(args, kwargs, sig, vals):
    """as_strided addresses the storage, not the view it is called on (PyTorch's semantics):
    on a view, it is recorded on the storage's value, with the view's own storage offset when
    the call gives none. Where that offset cannot be known, it stays relative to the view."""
    src = args[0]._state
    given = args[3] if len(args) > 3 else (kwargs or {}).get("storage_offset")
    off = given if given is not None else storage_offset(src)
    size = args[1] if len(args) > 1 else kwargs["size"]
    stride = args[2] if len(args) > 2 else kwargs["stride"]
    if off is not None and all(n > 0 for n in size):
        need = off + sum((n - 1) * st for n, st in zip(size, stride)) + 1
        if need > src.storage.meta.numel:
            raise LazyXlaError(f"aten::as_strided: sizes {list(size)}, strides {list(stride)} and storage offset "
                               f"{off} need a storage of {need} elements; this tensor's has "
                               f"{src.storage.meta.numel} at {fmt_where(user_frame(1))}")
    if src.chain is None or src.storage.meta.dtype != src.meta.dtype:
        return sig, vals, False
    if given is None:
        if off is None:
            return sig, vals, False
        k = (sig, off)
        s = _OFFSET_SIGS.get(k)
        if s is None:
            targs, tkw = sig.template
            s = _OFFSET_SIGS[k] = OpSig(sig.op, sig.func, sig.lower, (targs[:3] + (off,), tkw), sig.outs,
                                        cdtype=sig.cdtype)
        sig = s
    return sig, (src.storage.ir,) + vals[1:], True


def _as_returned(tensors, returns):
    if returns == "one":
        return tensors[0]
    return tensors if returns == "list" else tuple(tensors)


# Ops that take CPU index tensors with tensors on another device, as PyTorch's advanced
# indexing does (``x[torch.tensor([0, 2])]``, ``x[idx] = v``).
_CPU_INDEX_OPS = ("aten::index", "aten::index_put_", "aten::index_put", "aten::_index_put_impl_",
                  "aten::_unsafe_index", "aten::_unsafe_index_put")
_PACKED_SEQUENCE_OPS = ("aten::_pack_padded_sequence", "aten::_pad_packed_sequence", "aten::lstm", "aten::gru",
                        "aten::rnn_tanh", "aten::rnn_relu")


_SCALAR_KEYS = {float: ("S", float), int: ("S", int)}


def _key_item(a, is_value, ops, info):
    t = type(a)
    if t in SCALAR_TYPES:
        if is_value and not is_special(a):
            ops.append(a)
            return ("S", t)
        return (t, a)
    if t is AsData:  # a number recorded as data whatever its value (a special's ``Record``)
        if is_value:
            ops.append(float(a))
            return ("S", float)
        return (float, float(a))
    if t is list or t is tuple:
        return (t,) + tuple(_key_item(x, is_value, ops, info) for x in a)
    if isinstance(a, torch.Tensor):
        if isinstance(a, LazyTensor):
            ops.append(a._state.value())
            return a._state.meta
        if a.device.type == "cpu" and (a.dim() == 0 or info.name.split(".")[0] in _CPU_INDEX_OPS):
            up = upload(a)  # a CPU scalar tensor, or CPU indices (PyTorch accepts both)
            ops.append(up.storage.ir)
            return up.meta
        if a.layout != torch.strided:
            raise LazyXlaError(f"{info.name}: lazyxla does not support {a.layout} tensors (only dense ones) at "
                               f"{fmt_where(user_frame(1))}; use .to_dense()")
        if info.name.split(".")[0] in _PACKED_SEQUENCE_OPS:
            raise LazyXlaError(
                f"{info.name}: lazyxla does not support packed sequences yet (PyTorch keeps their lengths on "
                f"the CPU) at {fmt_where(user_frame(1))}; pad the batch and mask the padding instead")
        raise LazyXlaError(
            f"{info.name}: expected all tensors on {DEVICE}, but one is on {a.device} "
            f"(shape {list(a.shape)}, {a.dtype}) at {fmt_where(user_frame(1))}. Move it with .to(lazyxla.device())."
        )
    if t is torch.device:
        return ("dev", a.type)
    return a


def _write_out(node, sig, info, kwargs):
    outs = [kwargs[w] for w in info.written]
    for i, o in enumerate(outs):
        if not isinstance(o, LazyTensor):
            raise LazyXlaError(f"{info.name}: out= must be a lazyxla tensor")
        m = o._state.meta
        if m.shape != sig.outs[i].shape:  # PyTorch resizes out= (with a warning unless it was empty)
            if m.numel:
                warnings.warn_explicit(
                    f"{info.name}: an out= tensor with {m.numel} elements was resized from "
                    f"{list(m.shape)} to {list(sig.outs[i].shape)}", UserWarning,
                    *(user_frame(1) or ("<unknown>", 0))[:2], module="lazyxla")
            o.resize_(list(sig.outs[i].shape))
        o._state.write(converted((node, i), sig.outs[i], o._state.meta))
    return outs[0] if len(outs) == 1 else tuple(outs)
