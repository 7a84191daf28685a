"""Tools on top of the package, for lazyxla's own checks and its demo: ``demo`` (the ``lazyxla
demo`` run), ``coverage`` (which core ATen ops are lowered, verified on OpInfo samples:
``lazyxla coverage``, ``docs/coverage.md``) and ``opinfo`` (PyTorch's whole OpInfo database run
on the device: ``lazyxla coverage --opinfo``, ``docs/opinfo.md``).

May import: the public API and any stage; only ``cli`` imports it.
"""
