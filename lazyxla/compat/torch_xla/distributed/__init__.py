"""``torch_xla.distributed`` under ``lazyxla run``: ``parallel_loader``, ``xla_multiprocessing``,
``xla_backend`` and ``spmd`` are its submodules (imported on use). Touches nothing."""
from ... import not_offered

__getattr__ = not_offered(__name__)
