"""The persistent cache's HMAC key: the secret that signs every entry (R7).

Loading a compiled executable means running its writer's native code, so an entry loads only
if it carries a MAC under this key (``entry.decode_entry``): entries written by anyone without
the key fail and are recompiled. The key file is ``$LAZYXLA_CACHE_HMAC_KEY_FILE`` if set (a key
shared on purpose by the users of a shared cache), else ``$XDG_CACHE_HOME/lazyxla/cache_key``
(``~/.cache/...`` when ``XDG_CACHE_HOME`` is unset). It is created with mode 0600 on first use
when missing, atomically and without ever replacing a key another process made; a key file
that others can read gives a warning (they could forge entries).

May touch: the key file (created when missing, never replaced) and its directory.
"""
from __future__ import annotations

import os
import secrets
import stat
import warnings

from ...config import env_str
from ...files import write_atomic

ENV_KEY_FILE = "LAZYXLA_CACHE_HMAC_KEY_FILE"


class PersistentCacheError(OSError):
    """The cache directory or key file cannot be used."""


def key_file_path() -> tuple[str, bool]:
    """(path of the HMAC key file, shared?): ``$LAZYXLA_CACHE_HMAC_KEY_FILE`` or the user's."""
    shared = env_str(ENV_KEY_FILE)
    if shared:
        return os.path.abspath(os.path.expanduser(shared)), True
    base = env_str("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "lazyxla", "cache_key"), False


def read_or_create_key(path: str, shared: bool) -> bytes:
    """The key in ``path``, made first if the file is missing. Raises PersistentCacheError."""
    try:
        with open(path, "rb") as f:
            data = f.read().strip()
    except FileNotFoundError:
        data = None
    except OSError as e:
        raise PersistentCacheError(f"cannot read the cache HMAC key file {path}: {e}") from None
    if data is None:
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            try:
                write_atomic(path, secrets.token_hex(32).encode() + b"\n", mode=0o600, replace=False)
            except FileExistsError:  # another process made it first: use theirs
                pass
            with open(path, "rb") as f:
                data = f.read().strip()
        except OSError as e:
            raise PersistentCacheError(f"cannot create the cache HMAC key file {path}: {e}") from None
    if len(data) < 32:
        raise PersistentCacheError(f"the cache HMAC key file {path} holds fewer than 32 bytes")
    mode = os.stat(path).st_mode
    if mode & (0o007 if shared else 0o077):
        warnings.warn(f"lazyxla: the persistent cache HMAC key file {path} is accessible by "
                      f"{'other users' if shared else 'other users or the group'} "
                      f"(mode {stat.S_IMODE(mode):o}); anyone who can read it can forge cache entries",
                      RuntimeWarning, stacklevel=4)
    return data
