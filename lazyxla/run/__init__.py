"""Execution and values (stage 10 of the flow: ... compile -> **execute -> device buffers ->
tensors**): a program run, and where every tensor's value lives.

Holds ``execution`` (programs run asynchronously, at most two in flight; failures named with
their graph; ``wait_device_ops``) and ``storage`` (``Storage`` and ``TensorState``: a value is
pending IR or device data; views and writes through them; the arena of live tensors in creation
order; scalars as device data, R1.5; views of device data read on the host).

May import: ``lowering`` (the lowerings of the nodes a write through a view records), ``ir``,
``xla`` and the shared modules. The engine, the key stage and the front end read values
only through it.
"""
