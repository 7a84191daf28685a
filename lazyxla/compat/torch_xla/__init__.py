"""``torch_xla`` under ``lazyxla run``: the top-level names, forwarded to lazyxla's.

``device()`` -> ``lazyxla.device()``, ``sync()`` -> ``lazyxla.sync()``, ``compile``/``step`` ->
``lazyxla.compile``/``lazyxla.step``, ``launch`` -> ``lazyxla.distributed.launch``,
``manual_seed`` -> ``lazyxla.manual_seed``. Importing it imports the submodules a torch_xla
script reaches through ``torch_xla.`` (runtime, core.xla_model, debug.metrics, experimental,
amp, backends, utils.utils, distributed, _XLAC). Touches nothing itself.
"""
from __future__ import annotations

import jax

import lazyxla
import lazyxla.distributed
from lazyxla.config import TORCH_XLA_API

from ..  import not_offered
from . import _XLAC, amp, backends, core, debug, distributed, experimental, runtime, utils  # noqa: F401
from .core import xla_model  # noqa: F401
from .debug import metrics  # noqa: F401
from .utils import utils as _utils  # noqa: F401

# the torch_xla release whose API lazyxla follows; the local part names lazyxla (PEP 440)
__version__ = f"{TORCH_XLA_API}+lazyxla.{lazyxla.__version__}"


def device(index: int | None = None):
    """The lazy device (``lazyxla.device()``, ``lazyxla:0``)."""
    return lazyxla.device(0 if index is None else index)


def devices():
    return [lazyxla.device()]


def device_count() -> int:
    return 1


def real_devices():
    return [f"{runtime.device_type()}:{jax.devices()[0].id}"]


def sync(wait: bool = False, reset_scope: bool = True) -> None:
    """``lazyxla.sync(wait)``: the step's program, then its step closures."""
    lazyxla.sync(wait=wait)


def step():
    return lazyxla.step()


def compile(f=None, full_graph=False, name=None, max_different_graphs=None,  # noqa: A001
            custom_compile_options=None):
    """``lazyxla.compile(f, full_graph, name)``."""
    if max_different_graphs is not None:
        raise NotImplementedError("torch_xla.compile(max_different_graphs=...) is not offered by lazyxla (nearest "
                                  "lazyxla alternative: lazyxla.debug.recompile_log() explains each recompile)")
    if custom_compile_options:
        raise NotImplementedError("torch_xla.compile(custom_compile_options=...) is not offered by lazyxla (nearest "
                                  "lazyxla alternative: XLA_FLAGS)")
    return lazyxla.compile(f, full_graph=full_graph, name=name)


def manual_seed(seed, device=None) -> None:
    lazyxla.manual_seed(seed)


def launch(fn, args=(), start_method: str = "spawn", debug_single_process: bool = False):
    """``lazyxla.distributed.launch``: on a CPU, ``fn(0, *args)`` in this process (a world of one)."""
    return lazyxla.distributed.launch(fn, args, nprocs=1 if debug_single_process else None,
                                      start_method=start_method)


__getattr__ = not_offered(__name__, {
    "set_custom_compile_options": "XLA_FLAGS",
})
