"""The lazy device as PyTorch sees it: PrivateUse1 renamed ``lazyxla``, and ``torch.lazyxla``.

Importing this module renames PyTorch's PrivateUse1 backend to ``lazyxla`` and registers
its device module (what PyTorch asks of a backend: AMP dtypes, seeds, device counts,
``synchronize``), so that ``torch.device("lazyxla")`` exists; ``DEVICE`` is ``lazyxla:0``. It is
not one of ``torch.accelerator``'s accelerators (``torch.lazyxla.is_available()`` says so), so a
DataLoader with ``pin_memory=True`` does not try to pin for it.
``device()`` is torch_xla's ``torch_xla.device()``.

PyTorch's autograd engine runs the backward of a non-CPU device on a thread of its own; for
lazy tensors that only record IR, the hand-off costs more than the recording (two thread
wake-ups per backward on a busy machine). ``backward_in_calling_thread`` turns that off for
the thread that imports lazyxla or asks for its device (the setting is thread-local in
PyTorch); ``LAZYXLA_AUTOGRAD_DEVICE_THREAD=1`` keeps PyTorch's default.

May touch: PyTorch's backend registration and its autograd threading setting.
"""
from __future__ import annotations

import itertools

import torch
import torch.utils.backend_registration as _br

from ..ir import rng
from ..config import env_flag
from ..run.execution import wait_device_ops

BACKEND = "lazyxla"


class _DeviceModule:
    """``torch.lazyxla``."""

    @staticmethod
    def is_available():
        """False: lazyxla is not one of ``torch.accelerator``'s accelerators (which ask this), as
        torch_xla's device is not. PyTorch's DataLoader pins batches for an available accelerator,
        and pinning needs an allocator a Python backend cannot give (PyTorch raises); lazyxla
        uploads through JAX, for which pinned host memory does nothing. ``lazyxla.device()``
        works all the same."""
        return False

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
        rng.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def get_rng_state(device=None):
        return rng.get_state()

    @staticmethod
    def set_rng_state(new_state, device=None):
        rng.set_state(new_state)

    @staticmethod
    def synchronize(device=None):
        wait_device_ops()


class _DeviceGuard(torch._C._acc.DeviceGuard):
    """PyTorch's device guard for the lazy device. PyTorch asks a guard its device type from
    C++ each time it makes one (about ten times per parameter in a backward: AccumulateGrad,
    streams); the answer is a builtin's, so no Python frame runs for it."""

    type_ = staticmethod(itertools.repeat(torch._C._autograd.DeviceType.PrivateUse1).__next__)


if torch._C._get_privateuse1_backend_name() != BACKEND:
    _br._setup_privateuseone_for_python_backend(rename=BACKEND, backend_module=_DeviceModule(),
                                                device_guard=_DeviceGuard())
DEVICE = torch.device(BACKEND, 0)


def is_lazy(x) -> bool:
    """Whether ``x`` is a tensor on the lazy device (outside the warm path: it asks PyTorch)."""
    return isinstance(x, torch.Tensor) and x.device.type == BACKEND


AUTOGRAD_DEVICE_THREAD = env_flag("LAZYXLA_AUTOGRAD_DEVICE_THREAD", False)


def backward_in_calling_thread():
    if not AUTOGRAD_DEVICE_THREAD and torch._C._is_multithreading_enabled():
        torch._C._set_multithreading_enabled(False)


def device(index: int = 0) -> torch.device:
    """The lazy XLA device (torch_xla's ``torch_xla.device()``)."""
    if index != 0:
        raise ValueError(f"lazyxla has one logical device, lazyxla:0; asked for index {index}")
    backward_in_calling_thread()
    return DEVICE


backward_in_calling_thread()
