"""Lazy tensors, their storages, and the arena of live tensors.

A ``LazyTensor`` is a ``torch.Tensor`` wrapper subclass on the ``lazyxla`` device (PyTorch's
PrivateUse1 backend, renamed). It holds no numbers. Its value lives in a ``Storage``,
shared by a tensor and every view or alias of it (``.data``, ``detach()``, slices):

- ``storage.ir`` is the current value as an IR value ``(node, index)``: either pending IR,
  or a device-data leaf whose node holds a ``jax.Array`` (then ``storage.data`` is that array);
- a view tensor keeps the chain of view signatures from its storage's value and rebuilds its
  own IR from the storage when the storage's ``version`` has moved on.

The arena (R0 "live tensors") maps each tensor's unique id, from a counter starting at 1, to
a weak reference, in creation order; a sync walks it.

May touch: metrics counters. Knows nothing about ops, lowering or execution.
"""
from __future__ import annotations

import itertools
import os
import weakref

import torch
import torch.utils.backend_registration as _br

from . import metrics
from .ir import TensorMeta, data_leaf

BACKEND = "lazyxla"


class _DeviceModule:
    """``torch.lazyxla``: what PyTorch asks of a backend (AMP dtypes, seeds, counts)."""

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def is_initialized():
        return True

    @staticmethod
    def device_count():
        return 1

    @staticmethod
    def current_device():
        return 0

    @staticmethod
    def _is_in_bad_fork():
        return False

    @staticmethod
    def get_amp_supported_dtype():
        return [torch.bfloat16, torch.float16]

    @staticmethod
    def is_bf16_supported():
        return True

    @staticmethod
    def manual_seed(seed):
        from . import rng
        rng.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def synchronize(device=None):
        from .executor import wait_device_ops
        wait_device_ops()


def _register_backend():
    if torch._C._get_privateuse1_backend_name() != BACKEND:
        _br._setup_privateuseone_for_python_backend(rename=BACKEND, backend_module=_DeviceModule())


_register_backend()
DEVICE = torch.device(BACKEND, 0)


class Storage:
    """The value shared by a tensor and all its aliases."""

    __slots__ = ("ir", "data", "version", "meta", "donate", "__weakref__")

    def __init__(self, ir, meta, data=None):
        self.ir = ir
        self.data = data
        self.meta = meta
        self.version = 0
        self.donate = False

    @staticmethod
    def of_data(array, meta):
        st = Storage(None, meta, array)
        st.ir = (data_leaf(array, meta, _weakref(st)), 0)
        return st

    def set_ir(self, value):
        self.ir = value
        self.data = None
        self.version += 1

    def set_data(self, array):
        self.ir = (data_leaf(array, self.meta, _weakref(self)), 0)
        self.data = array
        self.version += 1
        self.donate = False  # a user's donation mark belongs to the old buffer


_weakref = weakref.ref
_ids = itertools.count(1)
# The arena: weak references to live tensors, in creation order (a dict keeps insertion order;
# a weak reference hashes as its tensor did, so a dead one still finds its entry).
LIVE: dict = {}
_counters = metrics.COUNTERS


def _forget(ref):
    LIVE.pop(ref, None)
    _counters["DestroyXlaTensor"] = _counters.get("DestroyXlaTensor", 0) + 1


_make_wrapper = torch.Tensor._make_wrapper_subclass


class LazyTensor(torch.Tensor):
    """A tensor on the lazy XLA device; see the module docstring."""

    __slots__ = ("_st", "_chain", "_ir", "_sv", "_meta", "_uid")

    @staticmethod
    def __new__(cls, storage: Storage, meta: TensorMeta, chain=None, requires_grad=False):
        t = _make_wrapper(cls, meta.shape, strides=meta.stride, dtype=meta.dtype, device=DEVICE,
                          requires_grad=requires_grad)
        t._st = storage
        t._chain = chain
        t._ir = None
        t._sv = -1
        t._meta = meta
        t._uid = next(_ids)
        LIVE[_weakref(t, _forget)] = None
        _counters["CreateXlaTensor"] = _counters.get("CreateXlaTensor", 0) + 1
        return t

    def __init__(self, *a, **k):
        pass

    __torch_function__ = torch._C._disabled_torch_function_impl
    __hash__ = object.__hash__  # by identity, as torch.Tensor's, without a Python call (the arena hashes each)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs)

    # -- values read on the host (R5); each is one value read -------------------------------
    def __repr__(self, *, tensor_contents=None):
        from .executor import read_values
        host = read_values([self])[0]
        body = repr(host)
        if body.endswith(")"):
            body = body[:-1] + f", device='{self.device}')"
        return body

    @property
    def data(self):
        """An alias sharing this tensor's value, outside autograd (as ``Tensor.data``)."""
        t = LazyTensor(self._st, self._meta, self._chain)
        if self._chain:
            t._ir, t._sv = self._ir, self._sv
        return t

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

    def __reduce_ex__(self, proto):
        # torch.save: the value (one value read) and where it goes back to; loadable with
        # torch.load(weights_only=True) once lazyxla is imported.
        host = self.detach().cpu()
        return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
                (host, self.dtype, str(self.device), self.requires_grad))


def _deepcopy(self, memo):
    """copy.deepcopy: a recorded clone (new storage), with the tensor's Python attributes."""
    import copy
    if id(self) in memo:
        return memo[id(self)]
    with torch.no_grad():
        r = self.clone()
    r.requires_grad_(self.requires_grad)
    for k, v in getattr(self, "__dict__", {}).items():
        setattr(r, k, copy.deepcopy(v, memo))
    memo[id(self)] = r
    return r


LazyTensor.__deepcopy__ = _deepcopy


# PyTorch's C++ ``Tensor.data`` setter: a shallow copy of sizes, strides and dtype between two
# lazy tensors (it keeps the target's autograd identity and version counter).
_set_metadata = torch._C.TensorBase.data.__set__


def become(t: LazyTensor, new: LazyTensor):
    """``t`` takes ``new``'s shape, strides, dtype and value in place, as an alias of its
    storage (``.data = ``, ``set_``, ``resize_``, ``t_``, ``unsqueeze_`` ...)."""
    _set_metadata(t, new)
    t._st, t._chain, t._ir, t._sv, t._meta = new._st, new._chain, new._ir, new._sv, new._meta


def value_of(t: LazyTensor):
    """The tensor's current IR value, rebuilding a view's IR if its storage moved on."""
    st = t._st
    chain = t._chain
    if chain is None:
        return st.ir
    if t._sv != st.version:
        from .dispatch import replay_chain
        t._ir = replay_chain(st.ir, chain)
        t._sv = st.version
    return t._ir


def to_device(host: torch.Tensor) -> LazyTensor:
    """Upload a CPU tensor: device data at once, no IR (TransferToDeviceTime)."""
    from .runtime import upload
    host = host.detach()
    meta = TensorMeta(host.shape, host.dtype)
    array = upload(host)
    return LazyTensor(Storage.of_data(array, meta), meta)


def live_tensors():
    """Live lazy tensors in creation order."""
    out = []
    for ref in list(LIVE):
        t = ref()
        if t is not None:
            out.append(t)
    return out


def device(index: int = 0) -> torch.device:
    """The lazy XLA device (torch_xla's ``torch_xla.device()``)."""
    if index != 0:
        raise ValueError(f"lazyxla has one logical device, lazyxla:0; asked for index {index}")
    backward_in_calling_thread()
    return DEVICE


# PyTorch's autograd engine runs the backward of a non-CPU device on a thread of its own; for
# lazy tensors that only records IR, the hand-off costs more than the recording (two thread
# wake-ups per backward on a busy machine). Turned off for the thread that imports lazyxla or
# asks for its device (the setting is thread-local in PyTorch); LAZYXLA_AUTOGRAD_DEVICE_THREAD=1
# keeps PyTorch's default.
AUTOGRAD_DEVICE_THREAD = os.environ.get("LAZYXLA_AUTOGRAD_DEVICE_THREAD", "0") not in ("", "0", "false", "False")


def backward_in_calling_thread():
    if not AUTOGRAD_DEVICE_THREAD and torch._C._is_multithreading_enabled():
        torch._C._set_multithreading_enabled(False)


backward_in_calling_thread()


from .dispatch import _dispatch  # noqa: E402  (dispatch imports this module)
