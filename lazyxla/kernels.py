"""PyTorch kernels for the lazy device: what reaches lazyxla without a lazy tensor argument.

``register()`` (called once by ``import lazyxla``) registers, for PyTorch's PrivateUse1 key:

- factories aimed at the device (``torch.zeros(..., device=lazyxla.device())``, ``arange``,
  ``rand``, ``empty`` ...) and a fallback for any other op reaching the key: recorded by the
  warm path (``tensor.dispatch``);
- uploads (``_to_copy`` of a CPU tensor: ``.to(device)``, ``Module.to``), with a warning when
  ``Module.to`` unties tied weights;
- for the AutogradPrivateUse1 key, PyTorch's decompositions of the recurrent layers (its
  composite RNNs pick fused cells that exist only for CUDA on a non-CPU device).

May touch: PyTorch's dispatcher registrations (once).
"""
from __future__ import annotations

import warnings
import weakref

import torch

from . import lowering
from .device import DEVICE
from .ir import user_frame
from .signature import describe
from .tensor import LazyTensor, dispatch, to_device

aten = torch.ops.aten

FACTORIES = ["arange", "arange.start", "arange.start_step", "full", "zeros", "ones", "scalar_tensor",
             "linspace", "logspace", "eye", "eye.m", "randperm", "rand", "randn", "randint", "randint.low",
             "empty.memory_format", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like"]
RNN_OPS = ("lstm.input", "lstm.data", "gru.input", "gru.data", "rnn_tanh.input", "rnn_tanh.data",
           "rnn_relu.input", "rnn_relu.data")


def _factory(func, args, kwargs):
    kwargs = dict(kwargs)
    kwargs.pop("pin_memory", None)
    return dispatch(LazyTensor, func, (), args, kwargs)


def _make_factory(op):
    def kernel(*args, **kwargs):
        return _factory(op, args, kwargs)
    return kernel


def _upload_to_copy(src, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
                    memory_format=None):
    host = src if dtype is None or dtype == src.dtype else src.to(dtype)
    up = to_device(host)
    if isinstance(src, torch.nn.Parameter):
        _note_parameter_upload(src, up)
    return up


# A CPU parameter shared by two modules (tied weights) reaches the upload once per module when
# ``model.to(lazyxla.device())`` converts them: PyTorch keeps the tie only for devices whose
# tensors can take a CPU tensor's data in place (CUDA can; lazyxla's, like torch_xla's, cannot).
# Two live uploads of one unchanged parameter say the tie was broken: tell the user.
# id of a live CPU Parameter -> (a weak reference whose callback drops the entry when the
# Parameter dies, its version, a weak reference to its upload's storage)
_UPLOADED_PARAMS: dict = {}


def _note_parameter_upload(src, up):
    prev = _UPLOADED_PARAMS.get(id(src))
    if prev is not None and prev[1] == src._version and prev[2]() is not None:
        where = user_frame(1) or ("<unknown>", 0, "")
        warnings.warn_explicit(
            f"lazyxla: the same Parameter ({describe(src)}) was moved to {DEVICE} twice: if it is shared by "
            f"two modules (tied weights), Module.to() gave each module its own copy (torch_xla does the same). "
            f"Tie them again after .to(), e.g. model.head.weight = model.embed.weight, or call the model's "
            f"tie_weights().", UserWarning, where[0], where[1], module="lazyxla")
    key = id(src)
    _UPLOADED_PARAMS[key] = (weakref.ref(src, lambda _r, k=key: _UPLOADED_PARAMS.pop(k, None)), src._version,
                             weakref.ref(up._state.storage))


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return dispatch(LazyTensor, aten.empty.memory_format, (), (list(size),), {"dtype": dtype, "device": DEVICE})


def _pu1_fallback(keyset, op, *args, **kwargs):
    return _factory(op, args, kwargs)


def _op(name):
    n, _, o = name.partition(".")
    return getattr(getattr(aten, n), o or "default")


_LIBRARIES: list = []  # PyTorch keeps a registration while its Library object lives


def register() -> None:
    """Register the kernels (once per process)."""
    if _LIBRARIES:
        return
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_to_copy", _upload_to_copy, "PrivateUse1")
    lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    for name in FACTORIES:
        lib.impl(name, _make_factory(_op(name)), "PrivateUse1")
    autograd_lib = torch.library.Library("aten", "IMPL")
    for name in RNN_OPS:
        autograd_lib.impl(name, lowering.DECOMPOSITIONS[_op(name)], "AutogradPrivateUse1")
    fallback_lib = torch.library.Library("_", "IMPL")
    fallback_lib.fallback(_pu1_fallback, dispatch_key="PrivateUse1", with_keyset=True)
    _LIBRARIES.extend((lib, autograd_lib, fallback_lib))
