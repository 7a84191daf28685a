"""The XLA side: JAX's device, host<->device transfers, and dtype conversions.

JAX runs on its default backend (the CPU here; a GPU where JAX has one). lazyxla turns on
JAX's 64-bit mode at import so that PyTorch's default int64 and float64 stay 64-bit.

May touch: JAX's global config (x64) and the transfer metrics.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch

from . import metrics

jax.config.update("jax_enable_x64", True)

TORCH_TO_JNP = {
    torch.float32: jnp.float32, torch.float64: jnp.float64, torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16, torch.int64: jnp.int64, torch.int32: jnp.int32,
    torch.int16: jnp.int16, torch.int8: jnp.int8, torch.uint8: jnp.uint8, torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64, torch.complex128: jnp.complex128,
}

_device = None


def jax_device():
    global _device
    if _device is None:
        _device = jax.devices()[0]
    return _device


def jnp_dtype(dt: torch.dtype):
    try:
        return TORCH_TO_JNP[dt]
    except KeyError:
        raise TypeError(f"lazyxla does not support dtype {dt}") from None


def upload(host: torch.Tensor):
    """Copy a CPU tensor to the device; returns a jax.Array."""
    t0 = metrics.now_ns()
    host = host.detach()
    if host.device.type != "cpu":
        host = host.cpu()
    if not host.is_contiguous():
        host = host.contiguous()
    # a copy: the device value must not follow later writes to the host tensor
    if host.dtype == torch.bfloat16:
        arr = host.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    else:
        arr = host.numpy().copy()
    out = jax.device_put(arr, jax_device())
    metrics.metric_add("TransferToDeviceTime", metrics.now_ns() - t0, "time")
    metrics.metric_add("InboundData", arr.nbytes, "bytes")
    return out


def download(arrays, dtypes) -> list:
    """Copy device arrays to new CPU tensors of the given torch dtypes."""
    t0 = metrics.now_ns()
    out = []
    for a, dt in zip(arrays, dtypes):
        npa = np.asarray(a)
        if dt == torch.bfloat16:
            t = torch.from_numpy(npa.view(np.int16).copy()).view(torch.bfloat16)
        else:
            t = torch.from_numpy(np.array(npa, copy=True))
            if t.dtype != dt:
                t = t.to(dt)
        out.append(t)
        metrics.metric_add("OutboundData", npa.nbytes, "bytes")
    metrics.metric_add("TransferFromDeviceTime", metrics.now_ns() - t0, "time")
    return out


def scalar_array(value, dtype: torch.dtype):
    """A 0-dim device array holding a Python scalar."""
    t0 = metrics.now_ns()
    npdt = np.dtype(jnp_dtype(dtype))
    if isinstance(value, int) and not isinstance(value, bool) and npdt.kind in "iu":
        value = np.asarray(value & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64).astype(npdt)  # wraps, as PyTorch does
    out = jax.device_put(np.asarray(value, dtype=npdt), jax_device())
    metrics.metric_add("TransferToDeviceTime", metrics.now_ns() - t0, "time")
    return out


from .persistent_cache import initialize_cache  # noqa: E402,F401  (torch_xla's xr.initialize_cache)
