"""lazyxla: torch_xla's lazy graph executor, in Python, on PyTorch and XLA through JAX.

Ordinary PyTorch on ``lazyxla.device()`` records pending IR; ``lazyxla.sync()`` or a value
read turns it into one XLA program, found in a compilation cache by its graph hash or
compiled and cached, then run. This module is the public API and the one place where the
parts are wired together: PyTorch's kernels for the device, the autocast policy and the
``torch.distributed`` backend are registered, and the diagnostics and the step closures
subscribe to the executor's events; the objects that exist by then are frozen for Python's
garbage collector (``LAZYXLA_GC_FREEZE``). It holds no state.

For torch_xla's training-loop helpers: ``add_step_closure`` (``closures``), ``compile`` and
``step`` (``compiled_step``), ``lazyxla.data.DeviceLoader``, ``lazyxla.experimental.eager_mode``,
``lazyxla.progress`` (rate tracker, ``master_print``); ``lazyxla run SCRIPT`` runs a torch_xla
script unchanged (``lazyxla.compat``).

The package reads as the data flows (docs/design.md, "Layers"): ``frontend`` (torch op -> IR
node), ``ir``, ``engine`` (sync, value read), ``keys`` (collect, graph hash), ``compiler``
(caches, compile), ``dynamic`` and ``rolling`` (a missed graph padded or rolled), ``lowering``,
``run`` (execute, buffers, tensors' values), ``xla`` (JAX); ``debug`` listens to the
engine; above the front end ``regions`` (torch.compile, scan), ``optim``, ``replay``, ``hf``,
``distributed``; on top ``tools``, ``compat`` and ``cli``. Each stage imports only those below it (``lint-imports``).
"""
from __future__ import annotations

import gc as _gc

from .frontend import autocast as _autocast
from .engine import closures as _closures
from . import backends, data, debug, events as _events, experimental, hf, progress  # noqa: F401  (public submodules)
from .engine import executor as _executor
from .frontend import kernels as _kernels
from .ir import rng as _rng
from .run import storage as _storage
from . import metrics as _metrics
from .optim import state as _optimizer_state
from .optim import fused as _optimizer_fused
from .optim import counts as _optimizer_counts
from .optim import adam as _optimizer_stacks
from .optim import param_stacks as _param_stacks
from .optim import sgd as _optimizer_sgd
from .optim import running_stats as _running_stats
from .hf import masks as _hf_masks
from .engine.closures import add_step_closure
from .replay.compiled_step import compile, step  # noqa: A004 - torch_xla's names; torch.compile is another thing
from .replay.graphs import Graph, graph, make_graphed_callables
from .regions.scan import scan, scan_layers
from .config import __version__, env_flag as _env_flag
from .frontend.device import device
from . import dynamic as _dynamic
from .run.execution import ExecutionError
from .errors import LazyXlaError
from .frontend.tensor import LazyTensor
from .distributed import c10d as _c10d

_kernels.register()
_c10d.register()
_autocast.register()
_optimizer_fused.install()  # first: the kernel is chosen before the first step's state is made (SGD's zero buffers)
_optimizer_state.install()
_optimizer_counts.install()
_optimizer_stacks.install()
_param_stacks.install()
_optimizer_sgd.install()
_running_stats.install()
_hf_masks.install()
debug.install()
_events.subscribe(_closures.StepClosures())

# Pending IR keeps many small objects alive until a sync, so Python's full collections come
# more often than in eager code, and each walks every object torch and JAX made at import
# (~240k, ~0.2 s per collection on a small machine). Frozen now, the collector skips them.
if _env_flag("LAZYXLA_GC_FREEZE", True):
    _gc.freeze()

__all__ = ["device", "sync", "mark_step", "wait_device_ops", "manual_seed", "dump_hlo", "graph_hash",
           "set_buffer_donation", "get_buffer_donation", "LazyTensor", "LazyXlaError", "ExecutionError",
           "debug", "__version__", "add_step_closure", "compile", "step", "data", "experimental",
           "progress", "backends", "Graph", "graph", "make_graphed_callables", "mark_dynamic", "scan", "scan_layers"]


def mark_dynamic(t, dim: int, max: int = None) -> None:  # noqa: A002 - torch's name
    """Dimension ``dim`` of ``t`` (a lazyxla tensor) is dynamic with bound ``max`` (default: its
    size's bucket): a graph that uses it runs one padded program for every size up to ``max``
    from its second size on; a size above ``max`` is an error (torch._dynamo's ``mark_dynamic``)."""
    st = getattr(t, "_state", None)
    if st is None:
        raise TypeError(f"lazyxla.mark_dynamic: expected a lazyxla tensor, got one on {t.device}")
    _dynamic.mark(st.storage, tuple(t.shape), dim, max)


def sync(wait: bool = False) -> None:
    """Run all pending operations as one program (torch_xla's ``torch_xla.sync``)."""
    _executor.sync(wait=wait)


mark_step = sync


def wait_device_ops() -> None:
    """Block until every scheduled program has finished; raise if one failed."""
    _executor.wait_device_ops()


def manual_seed(seed: int) -> None:
    """Set the device RNG seed (default 101)."""
    _rng.manual_seed(seed)


def _states(tensors):
    if not isinstance(tensors, (list, tuple)):
        tensors = [tensors]
    return [t._state for t in tensors]


def dump_hlo(tensors) -> str:
    """The XLA program text for the tensors' pending IR; compiles and counts nothing."""
    return _executor.dump_hlo(_states(tensors))


def graph_hash(tensors) -> str:
    """The graph hash (hex) that a sync of these tensors' pending IR would look up."""
    return _executor.graph_key(_states(tensors)).hex


def set_buffer_donation(tensor, should_donate: bool) -> bool:
    """Mark the tensor's device buffer for donation at the next sync (R9.3).

    Returns False when the tensor has no device buffer (pending IR). A donated buffer is
    gone after that program runs; reading the tensor then raises, unless the program
    also gave the tensor a new value.
    """
    if not _storage.set_donation(tensor._state, should_donate):
        return False
    _metrics.counter_inc("XlaSetBufferDonation")
    return True


def get_buffer_donation(tensor) -> bool:
    return bool(tensor._state.storage.donate)
