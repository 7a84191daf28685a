"""lazyxla's own error for what a user asked of it: ``LazyXlaError``.

Raised while recording, at the user's line (which the message names, with the op): a call
PyTorch itself refuses, an op lazyxla cannot do, a write it cannot carry out. Failures of a
compiled program are ``execution.ExecutionError``. Touches nothing.
"""


class LazyXlaError(RuntimeError):
    """A user error caught while recording an op; names the op and the user's line."""
