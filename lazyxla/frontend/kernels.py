"""PyTorch kernels for the lazy device: what reaches lazyxla without a lazy tensor argument.

``register()`` (called once by ``import lazyxla``) registers, for PyTorch's PrivateUse1 key:

- factories aimed at the device (``torch.zeros(..., device=lazyxla.device())``, ``arange``,
  ``rand``, ``empty`` ...) and a fallback for any other op reaching the key: recorded by the
  warm path (``tensor.dispatch``);
- uploads (``_to_copy`` of a CPU tensor: ``.to(device)``, ``Module.to``), and ``Module._apply``
  wrapped so that ``model.to(lazyxla.device())`` keeps tied weights tied, as it does for CUDA,
  and optimizers made before the move follow the new parameters (``param_moves``);
- for the AutogradPrivateUse1 key, PyTorch's decompositions of the recurrent layers (its
  composite RNNs pick fused cells that exist only for CUDA on a non-CPU device), and
  ``scaled_dot_product_attention`` and ``cross_entropy_loss`` as one node forward and one
  backward each (``attention``, ``cross_entropy``).

May touch: PyTorch's dispatcher registrations and ``torch.nn.Module._apply`` (once; and, through
``param_moves.install``, ``Optimizer.add_param_group``).
"""
from __future__ import annotations

import torch

from .. import lowering
from . import attention, cross_entropy, param_moves
from .device import DEVICE
from .tensor import LazyTensor, dispatch, to_device

aten = torch.ops.aten

FACTORIES = ["arange", "arange.start", "arange.start_step", "full", "zeros", "ones", "scalar_tensor",
             "linspace", "logspace", "eye", "eye.m", "randperm", "rand", "randn", "randint", "randint.low",
             "empty.memory_format", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like",
             "_efficientzerotensor"]
# ops taken over by one lazyxla node forward and one backward: each module's ``ATEN`` op gets its
# ``kernel`` for the autograd key, and its node ``OP`` the gradient ``backward`` (``setup`` saves)
ONE_NODE = (attention, cross_entropy)
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
    return to_device(host)


# ``Module._apply`` (behind ``.to()``, ``.cuda()``, ``.half()`` ...) makes a new Parameter for each
# module that holds a parameter when the device's tensors cannot take a CPU tensor's data in place
# (CUDA's can, lazyxla's, like torch_xla's, cannot): a Parameter shared by two modules (tied
# weights: an embedding and the output layer) would come out as two independent ones. The
# wrapper below puts the tie back: after the move, every place that held one Parameter holds the
# first new one, as eager PyTorch keeps them.
_module_apply = torch.nn.Module._apply
_applying = [0]  # depth of nested _apply calls (a module's _apply calls its children's)


def _apply_keeping_ties(self, fn, recurse=True):
    """``nn.Module._apply``, then tied parameters that became lazy tensors tied again, and the
    replaced parameters remembered for the optimizers that hold them (``param_moves``)."""
    if _applying[0]:
        return _module_apply(self, fn, recurse)
    before = param_moves.places(self, recurse)
    _applying[0] += 1
    try:
        out = _module_apply(self, fn, recurse)
    finally:
        _applying[0] -= 1
    for _, held in before.values():
        if len(held) < 2:
            continue
        first = held[0][0]._parameters[held[0][1]]
        if type(first) is LazyTensor:
            for m, name, _ in held[1:]:
                if type(m._parameters[name]) is LazyTensor:
                    m._parameters[name] = first
    param_moves.record(before)
    return out


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
    torch.nn.Module._apply = _apply_keeping_ties
    param_moves.install()
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_to_copy", _upload_to_copy, "PrivateUse1")
    lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    for name in FACTORIES:
        lib.impl(name, _make_factory(_op(name)), "PrivateUse1")
    autograd_lib = torch.library.Library("aten", "IMPL")
    for name in RNN_OPS:
        autograd_lib.impl(name, lowering.DECOMPOSITIONS[_op(name)], "AutogradPrivateUse1")
    for m in ONE_NODE:
        torch.library.register_autograd(m.OP, m.backward, setup_context=m.setup)
        autograd_lib.impl(m.ATEN, m.kernel, "AutogradPrivateUse1")
    fallback_lib = torch.library.Library("_", "IMPL")
    fallback_lib.fallback(_pu1_fallback, dispatch_key="PrivateUse1", with_keyset=True)
    _LIBRARIES.extend((lib, autograd_lib, fallback_lib))
