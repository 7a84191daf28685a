"""``torch_xla.distributed.parallel_loader`` (``pl``) under ``lazyxla run``: ``MpDeviceLoader`` and
``ParallelLoader`` are ``lazyxla.data.DeviceLoader`` (background uploads, a sync at each batch).

``device_prefetch_size`` is the loader's ``prefetch``, ``batches_per_execution`` its own; the
other tuning knobs (``loader_prefetch_size``, ``host_to_device_transfer_threads``, ``batchdim``)
are accepted and change nothing in the batches (one upload thread serves them).
``input_sharding`` is not offered. Touches nothing itself.
"""
from __future__ import annotations

from lazyxla.data import DeviceLoader

from ... import not_offered


def _settings(batchdim=0, batches_per_execution=1, loader_prefetch_size=16, device_prefetch_size=8,
              host_to_device_transfer_threads=1, input_sharding=None):
    """The DeviceLoader settings torch_xla's loader arguments ask for."""
    if input_sharding is not None:
        raise NotImplementedError("torch_xla.distributed.parallel_loader: input_sharding is not offered by lazyxla "
                                  "(nearest lazyxla alternative: lazyxla.distributed.spmd.mark_sharding on each "
                                  "batch)")
    return {"prefetch": device_prefetch_size, "batches_per_execution": batches_per_execution}


def _loader(loader, device, **kwargs):
    return DeviceLoader(loader, device, **_settings(**kwargs))


class MpDeviceLoader:
    """``MpDeviceLoader(loader, device, **kwargs)``: iterating gives the batches as device data,
    through a new ``DeviceLoader`` per iteration. torch_xla's attributes are kept for code that
    subclasses it (accelerate's ``MpDeviceLoaderWrapper``): ``_loader`` is the CPU loader,
    ``_device`` and ``_parallel_loader_kwargs`` what the batches go to and how; the CPU loader's
    other attributes show through."""

    def __init__(self, loader, device, **kwargs):
        _settings(**kwargs)  # refuses what is not offered now, not at the first batch
        self._loader = loader
        self._device = device
        self._parallel_loader_kwargs = kwargs

    def __iter__(self):
        return iter(_loader(self._loader, self._device, **self._parallel_loader_kwargs))

    def __len__(self):
        return len(self._loader)

    def __getattr__(self, name):
        """The wrapped loader's other attributes (``dataset``, ``sampler``, ...), as a wrapper
        around a DataLoader is expected to show them (accelerate's ``save_state`` reads
        ``dataset`` through it)."""
        if name.startswith("__") or name in ("_loader", "_device", "_parallel_loader_kwargs"):
            raise AttributeError(name)
        return getattr(self._loader, name)


class ParallelLoader:
    """``ParallelLoader(loader, [device], ...).per_device_loader(device)``."""

    def __init__(self, cpu_loader, devices, **kwargs):
        devices = list(devices)
        if len(devices) != 1:
            raise NotImplementedError(f"torch_xla.distributed.parallel_loader.ParallelLoader over {len(devices)} "
                                      "devices is not offered by lazyxla (one device per process: "
                                      "lazyxla.data.DeviceLoader(loader, lazyxla.device()))")
        self._loader = _loader(cpu_loader, devices[0], **kwargs)
        self._iter = None

    def per_device_loader(self, device):
        self._iter = iter(self._loader)
        return self._iter

    def per_device_samples(self):
        return len(self._loader)

    def close(self):
        if self._iter is not None:
            self._iter.close()


__getattr__ = not_offered(__name__, {"PerDeviceLoader": "lazyxla.data.DeviceLoader"})
