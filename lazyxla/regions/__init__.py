"""Regions (on top of the front end): a function traced once on placeholders and recorded as one
IR node per call, so that its ops are not traced again.

Holds ``region`` (a graph traced once, its IR copied out with numbered slots for its inputs and
its hash folded once (R13); ``CAPTURING`` while it runs), ``torch_compile``
(``torch.compile(backend="lazyxla")`` and ``"lazyxla_eval"``: Dynamo's graphs as regions, the
guard failures behind a recompile), ``dynamo_internals`` (the two places lazyxla reaches inside
Dynamo, checked against the pinned torch) and ``scan`` (``lazyxla.scan``, ``scan_layers``: a body
traced once, one ``lazyxla::scan`` node lowered to ``lax.scan``; its backward ``jax.vjp``).

May import: ``frontend``, ``engine`` (the read guard), ``run``, ``lowering``, ``ir``,
``xla`` and the shared modules.
"""
