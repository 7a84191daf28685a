"""lazyxla's own error for what a user asked of it: ``LazyXlaError``.

Raised while recording, at the user's line (which the message names, with the op): a call
PyTorch itself refuses, an op lazyxla cannot do, a write it cannot carry out. Failures of a
compiled program are ``execution.ExecutionError``. Where eager PyTorch refuses a call with an
exception of another type (``TypeError``, ``IndexError``, ``ValueError``), ``refusal(type)``
is a LazyXlaError that is that type too, so code that catches eager's exception catches
lazyxla's. Touches nothing.
"""


class LazyXlaError(RuntimeError):
    """A user error caught while recording an op; names the op and the user's line."""


_REFUSALS: dict = {RuntimeError: LazyXlaError}


def refusal(kind: type) -> type:
    """The LazyXlaError class that is also ``kind`` (an exception type eager PyTorch raises)."""
    cls = _REFUSALS.get(kind)
    if cls is None:
        cls = _REFUSALS[kind] = type("LazyXla" + kind.__name__, (LazyXlaError, kind),
                                     {"__doc__": f"A LazyXlaError where eager PyTorch raises {kind.__name__}.",
                                      "__module__": __name__})
    return cls
