"""Settings read from the environment, by one rule, and the package's version.

Every environment variable lazyxla reads goes through ``env_flag``, ``env_int`` or ``env_str``
so that ``XLA_ENABLE_PARAM_ALIASING=false``, ``=0``, ``=no`` and ``=off`` mean the same
thing everywhere (torch_xla reads its flags as ``true``/``false`` or an integer, non-zero
meaning true). A value that fits no rule is an error naming the variable, never a silent
default. Each caller reads its settings once, when its module is imported, unless it says
otherwise.

Touches nothing: reads ``os.environ`` only.
"""
from __future__ import annotations

import os

__version__ = "0.1.0"
# The torch_xla release whose Python API lazyxla follows (names, arguments, counters, report
# format): what ``torch_xla.__version__`` says under ``lazyxla run``, with lazyxla's as its local part.
TORCH_XLA_API = "2.9.0"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def env_str(name: str, default: str = "") -> str:
    """The variable's text, or ``default`` when it is unset."""
    return os.environ.get(name, default)


def env_flag(name: str, default: bool) -> bool:
    """A true/false setting: unset or empty gives ``default``; true, yes, on or a non-zero
    integer give True; false, no, off or 0 give False (case does not matter)."""
    v = os.environ.get(name, "").strip().lower()
    if not v:
        return default
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    try:
        return int(v) != 0
    except ValueError:
        raise ValueError(f"lazyxla: environment variable {name}={os.environ[name]!r} is not a true/false "
                         f"value (use 1/0, true/false, yes/no or on/off)") from None


def env_int(name: str, default: int) -> int:
    """An integer setting: unset or empty gives ``default``."""
    v = os.environ.get(name, "").strip()
    if not v:
        return default
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"lazyxla: environment variable {name}={v!r} is not an integer") from None
