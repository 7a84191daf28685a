"""The XLA side, through JAX: the device, host<->device transfers, dtypes, and the
compilation environment.

JAX runs on its default backend (the CPU here; a GPU where JAX has one). lazyxla turns on
JAX's 64-bit mode at import so that PyTorch's default int64 and float64 stay 64-bit.
``compile_environment()`` says what a compiled program depends on besides its graph: the
platform, the devices, the code-changing ``XLA_FLAGS`` and the versions of everything that
generates code; the graph hash folds it (R3 step 2) and the persistent cache checks it.

Also holds where programs run: SPMD's switches (``set_spmd``) and, in a job of several
processes, the process mesh (``set_process_mesh``, set by ``lazyxla.distributed.init``).
May touch: JAX's global config (x64) and the transfer metrics.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import jaxlib
import ml_dtypes
import numpy as np
import torch

from .. import metrics
from ..config import __version__, env_flag, env_int, env_str
from . import widths
from .jax_internals import hlo_sharding_text

jax.config.update("jax_enable_x64", True)
# torch_xla's CPU_NUM_DEVICES: how many CPU devices JAX's CPU client makes (read once, before
# JAX's backend starts; it is the process's device set from then on)
if env_int("CPU_NUM_DEVICES", 0) > 0:
    jax.config.update("jax_num_cpu_devices", env_int("CPU_NUM_DEVICES", 0))

TORCH_TO_JNP = {
    torch.float32: jnp.float32, torch.float64: jnp.float64, torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16, torch.int64: jnp.int64, torch.int32: jnp.int32,
    torch.int16: jnp.int16, torch.int8: jnp.int8, torch.uint8: jnp.uint8, torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64, torch.complex128: jnp.complex128,
    torch.complex32: jnp.complex64,  # JAX has no complex32: held as complex64, rounded when read
    torch.uint16: jnp.uint16, torch.uint32: jnp.uint32, torch.uint64: jnp.uint64,
}

_device = None


def jax_device():
    """This process's device (its first local one: in a job of several processes, JAX's
    device list holds every process's devices)."""
    global _device
    if _device is None:
        _device = jax.local_devices()[0]
    return _device


# A job of several processes (lazyxla.distributed.init): the mesh of one device per process
# that every program runs on, so that collectives can reduce across processes.
_process_mesh = None


def set_process_mesh(mesh) -> None:
    global _process_mesh
    _process_mesh = mesh


def process_mesh():
    return _process_mesh


# SPMD (R12): with it on, device data lives on every device, replicated until annotated.
_spmd = False
_auto = False  # use_spmd(auto=True): the auto-sharding flag (R3.6, R9.2)


def set_spmd(on: bool, auto: bool = False) -> None:
    global _spmd, _auto
    _spmd = bool(on)
    _auto = bool(on and auto)


def auto_sharding() -> bool:
    return _auto


def spmd() -> bool:
    return _spmd


def placement():
    """Where new device data goes: the device, or under SPMD every device, replicated."""
    if not _spmd:
        return jax_device()
    return _replicated()


@functools.lru_cache(maxsize=None)
def _replicated():
    devs = jax.devices()
    mesh = jax.sharding.Mesh(np.array(devs), ("all",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def sharding_tag(data):
    """Under SPMD, the HLO sharding text of device data (a jax.Array, or a program's output
    placeholder holding one): what the graph hash folds for a device-data leaf; None otherwise."""
    if not _spmd:
        return None
    array = getattr(data, "array", data)
    if array is None:  # a placeholder of a program that never ran
        return None
    return hlo_sharding_text(array.sharding, array.ndim)


_HELD = None  # TORCH_TO_JNP as this process's device holds each dtype (``widths``)


def jnp_dtype(dt: torch.dtype):
    """The JAX dtype the device holds a PyTorch dtype in: ``TORCH_TO_JNP``'s, but int32 for
    int64 where the device holds int64 in 32 bits (``widths``)."""
    global _HELD
    if _HELD is None:
        _HELD = dict(TORCH_TO_JNP)
        if widths.narrow():
            _HELD[torch.int64] = jnp.int32
    try:
        return _HELD[dt]
    except KeyError:
        raise TypeError(f"lazyxla does not support dtype {dt}") from None


def upload(host: torch.Tensor):
    """Copy a CPU tensor to the device; returns a jax.Array."""
    with metrics.timed("TransferToDeviceTime"):
        return _upload(host)


def _upload(host):
    arr = host_array(host)
    metrics.metric_add("InboundData", arr.nbytes, "bytes")
    return jax.device_put(arr, placement())


def host_array(host: torch.Tensor) -> np.ndarray:
    """A CPU tensor's value as a new numpy array (JAX's dtype for it)."""
    host = host.detach()
    if host.device.type != "cpu":
        host = host.cpu()
    host = host.resolve_conj().resolve_neg()  # PyTorch's lazy conjugate/negative bits: their values
    if host.dtype == torch.complex32:
        host = host.to(torch.complex64)
    if not host.is_contiguous():
        host = host.contiguous()
    # a copy: the device value must not follow later writes to the host tensor
    if host.dtype == torch.bfloat16:
        arr = host.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    elif host.dtype == torch.int64 and widths.narrow():
        arr = widths.check_host(host.numpy())  # a new int32 array, or an error naming the value
    else:
        arr = host.numpy().copy()
    return arr


def download(arrays, dtypes) -> list:
    """Copy device arrays to new CPU tensors of the given torch dtypes."""
    with metrics.timed("TransferFromDeviceTime"):
        return [_download(a, dt) for a, dt in zip(arrays, dtypes)]


def _download(a, dt):
    if not getattr(a, "is_fully_addressable", True):  # SPMD over several processes
        if a.is_fully_replicated:
            a = a.addressable_data(0)  # every process holds all of it
        else:  # the other processes' blocks: a collective, which every process must join
            from jax.experimental import multihost_utils
            a = multihost_utils.process_allgather(a, tiled=True)
    # a TPU may keep a program's output in another layout (a tied embedding, column-major), and
    # numpy gives its array those strides: the tensor is made row-major, as ``.cpu()`` of a
    # contiguous tensor is (safetensors writes a tensor's memory as it lies)
    npa = np.asarray(a)
    host = np.array(npa, copy=True, order="C")
    if dt == torch.bfloat16:
        t = torch.from_numpy(host.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(host)
        if t.dtype != dt:
            t = t.to(dt)
    metrics.metric_add("OutboundData", npa.nbytes, "bytes")
    return t


def copy_array(a):
    """A new device buffer with ``a``'s value (for a program that consumes its input)."""
    return jnp.array(a, copy=True)


def pad_zeros(array, pad):
    """``array`` with ``pad[d]`` zeros after its end along each dimension ``d`` (a padded
    program's input)."""
    return jax.lax.pad(array, jnp.zeros((), array.dtype), [(0, p, 0) for p in pad])


def leading(array, shape):
    """The leading block of ``shape`` of ``array`` (a padded program's output, cut back)."""
    return jax.lax.slice(array, (0,) * len(shape), tuple(shape))


_ROW_INDICES: list = []


def row_indices(n):
    """Device int32 scalars 0 .. n-1, made once each (a program's row indices: read, never
    written or donated)."""
    while len(_ROW_INDICES) < n:
        _ROW_INDICES.append(jax.device_put(np.int32(len(_ROW_INDICES)), placement()))
    return tuple(_ROW_INDICES[:n])


def zeros(shape, dtype):
    """Device zeros of a JAX dtype, put where new device data goes, without compiling anything
    (``jnp.zeros`` compiles a small program per shape: ~25 ms each)."""
    return jax.device_put(np.zeros(shape, dtype), placement())


def scalar_array(value, dtype: torch.dtype, wrap=False):
    """A 0-dim device array holding a Python scalar. An int64 held in 32 bits (``widths``) must
    fit them (an OverflowError otherwise), unless ``wrap``: a value that wraps as the dtype's
    arithmetic does (the random ops' seed)."""
    with metrics.timed("TransferToDeviceTime"):
        npdt = np.dtype(jnp_dtype(dtype))
        if isinstance(value, int) and not isinstance(value, bool) and npdt.kind in "iu":
            if dtype == torch.int64 and npdt.itemsize == 4 and not wrap:
                widths.check_scalar(value)
            value = np.asarray(value & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64).astype(npdt)  # wraps, as PyTorch does
        return jax.device_put(np.asarray(value, dtype=npdt), placement())


# XLA_FLAGS that do not change compiled code (dump and debug output): left out of the
# compilation environment.
_IGNORED_FLAGS = {
    "--xla_dump_to", "--xla_dump_hlo_as_text", "--xla_dump_hlo_as_proto", "--xla_dump_hlo_as_dot",
    "--xla_dump_hlo_as_url", "--xla_dump_hlo_as_html", "--xla_dump_fusion_visualization",
    "--xla_dump_hlo_snapshots", "--xla_dump_include_timestamp", "--xla_dump_max_hlo_modules",
    "--xla_dump_module_metadata", "--xla_dump_hlo_pass_re", "--xla_dump_hlo_module_re",
    "--xla_dump_compress_protos", "--xla_dump_disable_metadata", "--xla_dump_large_constants",
    "--xla_dump_hlo_pipeline_re", "--xla_force_host_platform_device_count",
}


def _code_flags(value: str) -> str:
    """The code-changing ``--xla`` flags of an ``XLA_FLAGS`` text, sorted."""
    keep = [tok for tok in value.split() if tok.startswith("--xla") and tok.split("=", 1)[0] not in _IGNORED_FLAGS]
    return " ".join(sorted(keep))


# The bits random ops draw (``lowering.random``): XLA's RngBitGenerator ("rbg", as torch_xla),
# or JAX's "unsafe_rbg" or "threefry2x32"; part of the compile environment
PRNG_IMPL = env_str("LAZYXLA_PRNG_IMPL", "rbg")
if PRNG_IMPL not in ("rbg", "unsafe_rbg", "threefry2x32"):
    raise ValueError(f"LAZYXLA_PRNG_IMPL={PRNG_IMPL!r}: one of rbg, unsafe_rbg, threefry2x32")


# Pallas kernels in place of XLA lowerings (``lowering.tpu_kernels``): ``on`` (the default: on a
# TPU, where a kernel's rules fit), ``off``, or ``interpret`` (on any platform, by Pallas'
# interpreter: the tests on a CPU). Read once; ``tpu_kernels_mode()`` is what this process does.
TPU_KERNELS = env_str("LAZYXLA_TPU_KERNELS", "on").strip().lower() or "on"
if TPU_KERNELS not in ("off", "on", "interpret"):
    raise ValueError(f"LAZYXLA_TPU_KERNELS={TPU_KERNELS!r}: one of off, on, interpret")


def tpu_kernels_mode() -> str:
    """What this process's programs use: ``off`` (the XLA lowerings: ``off``, or ``on`` on a
    platform other than a TPU), ``on`` (the kernels, compiled for the TPU) or ``interpret``."""
    if TPU_KERNELS == "on" and jax_device().platform != "tpu":
        return "off"
    return TPU_KERNELS


@functools.lru_cache(maxsize=1)
def compile_environment() -> dict:
    """What a compiled program depends on besides its graph, read once per process:
    ``platform``, ``platform_version``, ``devices``, the code-changing ``XLA_FLAGS``,
    ``XLA_IR_DEBUG``, ``XLA_HLO_DEBUG``, ``LAZYXLA_CHECK_VALUES`` (value checks change the
    program: ``lowering.program``), ``LAZYXLA_PRNG_IMPL`` (the bits random ops draw),
    ``LAZYXLA_TPU_KERNELS`` (whether Pallas kernels replace lowerings: ``tpu_kernels_mode()``),
    ``XLA_USE_32BIT_LONG`` (the bits an int64 is held in: ``widths.long_bits()``),
    and the versions ``jax``, ``jaxlib``, ``torch`` (with its git revision ``torch_git``) and
    ``lazyxla``."""
    dev = jax_device()
    return {
        "platform": dev.platform,
        "platform_version": getattr(dev.client, "platform_version", ""),
        "devices": ",".join(str(d) for d in jax.devices()),
        "XLA_FLAGS": _code_flags(env_str("XLA_FLAGS")),
        "XLA_IR_DEBUG": env_str("XLA_IR_DEBUG"),
        "XLA_HLO_DEBUG": env_str("XLA_HLO_DEBUG"),
        "LAZYXLA_CHECK_VALUES": "1" if env_flag("LAZYXLA_CHECK_VALUES", True) else "0",
        "LAZYXLA_PRNG_IMPL": PRNG_IMPL,
        "LAZYXLA_TPU_KERNELS": tpu_kernels_mode(),
        "XLA_USE_32BIT_LONG": str(widths.long_bits()),  # int64's width on the device (``widths``)
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "torch": f"{torch.__version__} ({torch.version.git_version})",
        "torch_git": torch.version.git_version,
        "lazyxla": __version__,
    }

