"""lazyxla: torch_xla's lazy graph executor, in Python, on PyTorch and XLA through JAX.

Ordinary PyTorch on ``lazyxla.device()`` records pending IR; ``lazyxla.sync()`` or a value
read turns it into one XLA program, found in a compilation cache by its graph hash or
compiled and cached, then run. This module is the public API; it holds no state.
"""
from __future__ import annotations

__version__ = "0.1.0"

from . import runtime as _runtime  # noqa: F401  (JAX config first: 64-bit mode)
from .tensor import LazyTensor, device  # noqa: E402
from . import executor as _executor  # noqa: E402
from . import rng as _rng  # noqa: E402
from .dispatch import LazyXlaError  # noqa: E402
from .executor import ExecutionError  # noqa: E402
from . import autocast as _autocast  # noqa: E402,F401
from . import explain as _explain  # noqa: E402,F401  (registers the recompile observer)
from . import debug_report as _debug_report  # noqa: E402,F401  (PT_XLA_DEBUG_LEVEL output)

__all__ = ["device", "sync", "wait_device_ops", "manual_seed", "dump_hlo", "graph_hash",
           "LazyTensor", "LazyXlaError", "ExecutionError", "__version__"]


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


def dump_hlo(tensors) -> str:
    """The XLA program text for the tensors' pending IR; compiles and counts nothing."""
    if not isinstance(tensors, (list, tuple)):
        tensors = [tensors]
    return _executor.dump_hlo(tensors)


def graph_hash(tensors) -> str:
    """The graph hash (hex) that a sync of these tensors' pending IR would look up."""
    if not isinstance(tensors, (list, tuple)):
        tensors = [tensors]
    return _executor.graph_key(tensors).hex


def set_buffer_donation(tensor, should_donate: bool) -> bool:
    """Mark the tensor's device buffer for donation at the next sync (R9.3).

    Returns False when the tensor has no device buffer (pending IR). A donated buffer is
    gone after that program runs; reading the tensor then raises, unless the program
    also gave the tensor a new value.
    """
    from . import metrics
    st = tensor._st
    if st.data is None:
        return False
    st.donate = bool(should_donate)
    metrics.counter_inc("XlaSetBufferDonation")
    return True


def get_buffer_donation(tensor) -> bool:
    return bool(tensor._st.donate)
