"""The persistent compilation cache (R7 in docs/design.md): compiled XLA programs on disk, one
file per key.

Job: keep compiled programs across processes, so that a second process running the same graph
loads its executable instead of compiling it. ``get_cache()`` gives the process-wide cache, set up
once from ``XLA_PERSISTENT_CACHE_PATH`` (empty or unset: off),
``XLA_PERSISTENT_CACHE_READ_ONLY`` (a true/false setting, ``lazyxla.config``) and
``LAZYXLA_PERSISTENT_CACHE_MAX_BYTES`` (a byte count, with an optional k/m/g/t suffix);
``initialize_cache(path, readonly)`` sets the first two before the first use (torch_xla's
``xr.initialize_cache``). The cache itself is ``store.PersistentCache``
(``load(key, arg_specs, n_outputs)``, ``store(key, compiled, meta)``, ``entries()``, ...).

Where things live: ``entry`` is the entry file format and its checks, ``hmac_key`` the secret
that signs entries and why, ``store`` the directory: what a load trusts, atomic writes, eviction.

May touch: the environment (reads the settings above; ``initialize_cache`` writes the two
``XLA_PERSISTENT_CACHE_*`` variables); the cache directory and key file through ``store``.
"""
from __future__ import annotations

import os
import threading
import warnings

from ...config import env_flag, env_str
from .entry import DIGEST, HEADER, decode_entry, encode_entry
from .hmac_key import PersistentCacheError, key_file_path
from .store import STALE_TEMP_SECONDS, PersistentCache

__all__ = ["PersistentCache", "PersistentCacheError", "get_cache", "initialize_cache", "encode_entry",
           "decode_entry", "key_file_path", "max_bytes_from_env", "DIGEST", "HEADER", "STALE_TEMP_SECONDS",
           "ENV_PATH", "ENV_READ_ONLY", "ENV_MAX_BYTES"]

ENV_PATH = "XLA_PERSISTENT_CACHE_PATH"
ENV_READ_ONLY = "XLA_PERSISTENT_CACHE_READ_ONLY"
ENV_MAX_BYTES = "LAZYXLA_PERSISTENT_CACHE_MAX_BYTES"

_INIT_LOCK = threading.Lock()
_initialized = False
_cache: PersistentCache | None = None


def max_bytes_from_env():
    """``LAZYXLA_PERSISTENT_CACHE_MAX_BYTES`` as a byte count (``64k``, ``2G`` and so on), or
    None when unset; a value that is not a byte count warns and gives None."""
    v = env_str(ENV_MAX_BYTES).strip()
    if not v:
        return None
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    try:
        if v[-1].lower() in units:
            return int(float(v[:-1]) * units[v[-1].lower()])
        return int(v)
    except ValueError:
        warnings.warn(f"lazyxla: ignoring {ENV_MAX_BYTES}={v!r} (not a byte count)", RuntimeWarning,
                      stacklevel=3)
        return None


def get_cache() -> PersistentCache | None:
    """The process-wide persistent cache, or None when off or unusable. Reads
    ``XLA_PERSISTENT_CACHE_PATH``, ``XLA_PERSISTENT_CACHE_READ_ONLY`` and
    ``LAZYXLA_PERSISTENT_CACHE_MAX_BYTES`` once, at the first call; an unusable path or key
    file gives one warning and the cache stays off for the process."""
    global _initialized, _cache
    if _initialized:
        return _cache
    with _INIT_LOCK:
        if not _initialized:
            path = env_str(ENV_PATH)
            cache = None
            if path:
                try:
                    cache = PersistentCache(path, env_flag(ENV_READ_ONLY, False), max_bytes_from_env())
                    cache.mac_key  # noqa: B018 - a key file that cannot be made disables the cache
                except OSError as e:  # PersistentCacheError, or the directory vanishing meanwhile
                    warnings.warn(f"lazyxla: persistent compilation cache disabled: {e}",
                                  RuntimeWarning, stacklevel=3)
                    cache = None
            _cache = cache
            _initialized = True
    return _cache


def initialize_cache(path, readonly: bool = False) -> None:
    """torch_xla's ``xr.initialize_cache``: set ``XLA_PERSISTENT_CACHE_PATH`` and
    ``XLA_PERSISTENT_CACHE_READ_ONLY`` for this process. Must come before the first compile:
    raises RuntimeError once the cache has been initialized."""
    if _initialized:
        raise RuntimeError("lazyxla: the persistent cache is already initialized; call "
                           "initialize_cache() before anything is compiled")
    os.environ[ENV_PATH] = os.fspath(path)
    os.environ[ENV_READ_ONLY] = "1" if readonly else "0"


def _reset_for_tests():
    global _initialized, _cache
    with _INIT_LOCK:
        _initialized = False
        _cache = None
