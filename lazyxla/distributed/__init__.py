"""torch_xla's ``torch_xla.distributed`` for lazyxla: ``spmd`` (sharding over a device mesh).
Touches nothing itself."""
