"""``torch_xla.utils.utils`` (``xu``) under ``lazyxla run``: ``SampleGenerator``
(``lazyxla.data.SampleGenerator``), ``getenv_as``. Touches nothing itself."""
from __future__ import annotations

from lazyxla.config import env_str
from lazyxla.data import SampleGenerator  # noqa: F401

from ... import not_offered


def getenv_as(name, type, defval=None):  # noqa: A002 - torch_xla's signature
    """The environment variable ``name`` converted by ``type`` (``bool``: a true/false text), or ``defval``."""
    value = env_str(name, "")
    if value == "":
        return defval
    if type is bool:
        return value.strip().lower() in ("1", "true", "yes", "on")
    return type(value)


__getattr__ = not_offered(__name__, {
    "FnDataGenerator": "lazyxla.data.SampleGenerator",
    "DataWrapper": "lazyxla.data.DeviceLoader",
})
