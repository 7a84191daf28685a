"""``torch_xla.experimental.scan_layers`` under ``lazyxla run``: ``lazyxla.scan_layers``
(``partition_fn`` and ``is_layer_pure`` accepted, as ``scan``'s). Touches nothing itself."""
from lazyxla.regions.scan import scan_layers as _scan_layers


def scan_layers(layers, input_data, partition_fn=None, is_layer_pure=False):
    return _scan_layers(layers, input_data)
