"""The training step's special ops (on top of the front end and regions): an optimizer step,
its state and batch norm's running statistics recorded as few nodes, on buffers kept stacked.

Holds ``state`` (an optimizer's first step: its new state made as device data, so the first
step's program is the steady one), ``fused`` (Adam and AdamW left to their default stepped
fused), ``counts`` (per-parameter step counts added on the host), ``stacks`` (tensors kept as the
rows of one device buffer), ``param_stacks`` (a fused group's alike parameters made rows of one
stack), ``adam`` (the fused Adam/AdamW step as one node, moments stacked), ``sgd`` (the fused
SGD step as one node) and ``running_stats`` (batch norm in training as one node that also
writes the running mean and variance).

May import: ``regions`` (``CAPTURING``; ``scan``'s stacked gradients), ``frontend``,
``engine``, ``rolling`` (how deep a loop must be), ``run``, ``lowering``, ``ir``, ``xla``
and the shared modules. Each module's ``install()`` is called once by ``import lazyxla``.
"""
