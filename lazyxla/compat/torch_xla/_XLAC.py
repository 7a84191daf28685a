"""``torch_xla._XLAC`` under ``lazyxla run``: the few C++ bindings torch_xla scripts call directly.

``_xla_metrics_report()`` (``lazyxla.debug.metrics.metrics_report``), eager mode's switch,
``_xla_wait_device_ops``, ``_xla_get_default_device``. Touches nothing itself.
"""
from __future__ import annotations

import lazyxla
import lazyxla.debug.metrics as _met

from .. import not_offered
from ...engine import eager as _eager


def _xla_metrics_report() -> str:
    return _met.metrics_report()


def _xla_counter_value(name):
    return _met.counter_value(name)


def _xla_wait_device_ops(devices=()) -> None:
    lazyxla.wait_device_ops()


def _xla_get_default_device() -> str:
    return str(lazyxla.device())


def _get_use_eager_mode() -> bool:
    return _eager.is_eager()


def _set_use_eager_mode(enable: bool) -> None:
    _eager.set_eager(enable)


__getattr__ = not_offered(__name__, {
    "_get_xla_tensors_text": "lazyxla.dump_hlo(tensors)",
    "_get_xla_tensors_hlo": "lazyxla.dump_hlo(tensors)",
    "_get_graph_hash": "lazyxla.graph_hash(tensors)",
    "_xla_sync_multi": "lazyxla.sync()",
    "_xla_step_marker": "lazyxla.sync()",
})
