"""Input data for the device: ``DeviceLoader`` (batches uploaded in the background) and
``SampleGenerator`` (the same sample, over and over: synthetic data).

``DeviceLoader(loader, device)`` wraps any iterable of batches (a ``torch.utils.data.DataLoader``)
the way torch_xla's ``MpDeviceLoader`` does. Iterating it starts one background thread that
takes the next batches from ``loader`` and copies their CPU tensors to the device (the host to
device transfer, ``xla.upload``: a ``jax.device_put``, which is thread-safe), up to
``prefetch`` batches ahead, while the current step is traced. The consuming thread turns each
uploaded buffer into a lazy tensor (device data, no IR) when it takes the batch, so the arena
of live tensors keeps the program's order. Before each batch it hands out, and after the last,
the loader syncs (``lazyxla.sync()``: the step that used the previous batch is one program),
every ``batches_per_execution`` batches (default 1). A batch keeps its structure: tuples,
lists, dicts (and namedtuples) of tensors, with anything else passed through. An error in
``loader`` is raised in the consuming thread, at the batch where it happened.

May touch: its own background thread and queue; the device (uploads); it syncs.
"""
from __future__ import annotations

import queue
import threading

import torch
from torch.utils._pytree import tree_map

from .engine import executor
from .xla import client as xla
from .ir.node import TensorMeta
from .run.storage import device_data
from .frontend.tensor import LazyTensor

__all__ = ["DeviceLoader", "SampleGenerator", "send_to_device"]

_END = object()


class _Uploaded:
    """A CPU tensor's device buffer, made in the background thread."""

    __slots__ = ("array", "meta")

    def __init__(self, array, meta):
        self.array = array
        self.meta = meta


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error


def _upload_leaf(x):
    """A CPU tensor as its uploaded buffer (runs in the background); anything else as it is."""
    if isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dtype in xla.TORCH_TO_JNP \
            and x.layout == torch.strided:
        return _Uploaded(xla.upload(x), TensorMeta(tuple(x.shape), x.dtype))
    return x  # another tensor is moved by the consuming thread (.to(device)), with its usual checks


def _device_leaf(x, device):
    """An uploaded buffer as a lazy tensor (runs in the consuming thread)."""
    if type(x) is _Uploaded:
        return LazyTensor(device_data(x.array, x.meta))
    if isinstance(x, torch.Tensor):
        return x.to(device)
    return x


def send_to_device(data, device):
    """``data`` with every CPU tensor in it uploaded to ``device`` (torch_xla's
    ``xm.send_cpu_data_to_device``): a new structure of the same containers, the tensors already
    on the device and every other value as they are; ``data`` is not changed."""
    return tree_map(lambda x: _device_leaf(_upload_leaf(x), device), data)


def _put(q, stop, item) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _work(it, q, stop):
    """The background thread: upload each batch of ``it`` into ``q`` until done or stopped. It
    holds no reference to the iterator object, so a loop left early (``islice``, ``break``)
    frees the iterator, whose ``__del__`` stops this thread."""
    try:
        for batch in it:
            if stop.is_set() or not _put(q, stop, tree_map(_upload_leaf, batch)):
                return
    except BaseException as e:  # noqa: BLE001 - raised in the consuming thread
        _put(q, stop, _Failed(e))
        return
    _put(q, stop, _END)


class _Iterator:
    def __init__(self, owner):
        self._owner = owner
        self._queue: queue.Queue = queue.Queue(max(1, owner.prefetch))
        self._stop = threading.Event()
        self._handed = 0
        self._done = False
        self._thread = threading.Thread(target=_work, args=(iter(owner.loader), self._queue, self._stop),
                                        name="lazyxla-device-loader", daemon=True)
        self._thread.start()

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        if self._handed % self._owner.batches_per_execution == 0:
            executor.sync()  # the step that used the previous batch(es) becomes one program
        item = self._queue.get()
        if item is _END or type(item) is _Failed:
            self._done = True
            self._thread.join()
            if item is not _END:
                raise item.error
            executor.sync()
            raise StopIteration
        self._handed += 1
        device = self._owner.device
        return tree_map(lambda x: _device_leaf(x, device), item)

    def close(self):
        """Stop the background thread (a loop left early)."""
        self._done = True
        self._stop.set()

    def __del__(self):
        self._stop.set()


class DeviceLoader:
    """Batches of ``loader`` as device data, uploaded in the background; see the module docstring.

    ``prefetch``: how many uploaded batches may wait (default 8, torch_xla's
    ``device_prefetch_size``); ``batches_per_execution``: sync every that many batches (default 1)."""

    def __init__(self, loader, device=None, prefetch: int = 8, batches_per_execution: int = 1):
        if batches_per_execution < 1:
            raise ValueError(f"lazyxla.data.DeviceLoader: batches_per_execution must be at least 1, "
                             f"not {batches_per_execution}")
        self.loader = loader
        self.device = torch.device(device) if device is not None else torch.device("lazyxla", 0)
        self.prefetch = int(prefetch)
        self.batches_per_execution = int(batches_per_execution)

    def __iter__(self):
        return _Iterator(self)

    def __len__(self):
        return len(self.loader)


class SampleGenerator:
    """An iterable that gives ``data`` ``sample_count`` times (torch_xla's ``xu.SampleGenerator``):
    synthetic data in place of a DataLoader; ``len()`` is ``sample_count``."""

    def __init__(self, data, sample_count: int):
        self.data = data
        self.sample_count = int(sample_count)

    def __iter__(self):
        for _ in range(self.sample_count):
            yield self.data

    def __len__(self):
        return self.sample_count
