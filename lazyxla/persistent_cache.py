"""The persistent compilation cache (R7 in docs/design.md): compiled XLA programs on disk, one file per key.

Job: keep compiled programs across processes, so that a second process running the same graph
loads its executable instead of compiling it. ``get_cache()`` gives the process-wide cache, set up
once from ``XLA_PERSISTENT_CACHE_PATH`` (empty or unset: off) and
``XLA_PERSISTENT_CACHE_READ_ONLY=1``; ``initialize_cache(path, readonly)`` sets those two settings
before the first use (torch_xla's ``xr.initialize_cache``). ``PersistentCache.load(key, arg_specs,
n_outputs)`` returns a callable that runs like the ``jax.stages.Compiled`` that was stored
(``fn(*arrays) -> tuple``, donation included), or None on a miss or a bad entry; ``store(key,
compiled, meta)`` writes one.

Touches:
- the cache directory: entry files named ``<key hex>`` and, while being written, temp files
  ``.<key hex>.<pid>.<random>.tmp`` (renamed into place, or swept when stale); nothing else in
  the directory is read, changed or deleted. Read-only mode writes, touches and deletes nothing
  there.
- the HMAC key file: ``$LAZYXLA_CACHE_HMAC_KEY_FILE`` if set (a key shared on purpose by the
  users of a shared cache), else ``$XDG_CACHE_HOME/lazyxla/cache_key`` (``~/.cache/...`` when
  ``XDG_CACHE_HOME`` is unset); created with mode 0600 on first use when missing.
- counters ``PersistentCacheMiss``, ``PersistentCacheHit``, ``PersistentCacheDeserializeFailure``
  and the timed metric ``PersistentCacheLoad`` (``lazyxla.metrics``).
- environment reads: the settings above and ``LAZYXLA_PERSISTENT_CACHE_MAX_BYTES``;
  ``initialize_cache`` writes the two ``XLA_PERSISTENT_CACHE_*`` variables.

Entry file format (version 1), all integers little-endian::

    header   24 bytes   magic b"LZXLAPC\\0", u32 format version, u32 metadata length,
                        u64 executable length
    metadata            UTF-8 JSON object: key, versions (jax, jaxlib, torch, lazyxla),
                        XLA_FLAGS, platform, devices, created time, argument specs, kept
                        arguments, donated arguments, output specs, n_outputs, caller's extras
    payload             the executable, as serialized by the PJRT client
    checksum 32 bytes   SHA-256 of header + metadata + payload (catches accidents)
    mac      32 bytes   HMAC-SHA256 under the per-user key of everything before it
                        (catches other writers)

Security model: a compiled executable is native code, and loading one means trusting its writer.
Nothing is ever unpickled; an entry is handed to ``deserialize_executable`` only after its size,
checksum and MAC verify and its metadata matches the key, the versions and the argument specs
asked for. Any other entry (empty, truncated, garbage, bit-flipped, foreign MAC, mismatched
metadata) counts ``PersistentCacheDeserializeFailure``, is deleted unless read-only, and is a
miss: the caller recompiles and stores again. Writes are atomic (temp file in the same directory,
fsync, ``os.replace``): concurrent writers of one key leave the last complete file, and a writer
killed mid-write leaves only a temp file, never an entry.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import struct
import tempfile
import threading
import time
import warnings

from . import metrics

MAGIC = b"LZXLAPC\x00"
FORMAT_VERSION = 1
HEADER = struct.Struct("<8sIIQ")  # magic, format version, metadata length, payload length
DIGEST = 32                       # SHA-256 and HMAC-SHA256 sizes
MAX_META = 1 << 20
STALE_TEMP_SECONDS = 3600         # temp files older than this are a dead writer's; swept on store

_ENTRY_RE = re.compile(r"^[0-9a-f]{2,256}$")
_TEMP_RE = re.compile(r"^\.[0-9a-f]{2,256}\.\d+\.[A-Za-z0-9_]+\.tmp$")

ENV_PATH = "XLA_PERSISTENT_CACHE_PATH"
ENV_READ_ONLY = "XLA_PERSISTENT_CACHE_READ_ONLY"
ENV_MAX_BYTES = "LAZYXLA_PERSISTENT_CACHE_MAX_BYTES"
ENV_KEY_FILE = "LAZYXLA_CACHE_HMAC_KEY_FILE"

# Writing in chunks lets a test kill a writer mid-file; ``_chunk_pause`` is 0 outside tests.
_CHUNK_BYTES = 1 << 20
_chunk_pause = 0.0

# Which way a loaded executable is called: "compiled" rebuilds a jax.stages.Compiled around it
# (JAX's C++ dispatch fast path, argument checks); "raw" calls LoadedExecutable.execute_sharded.
# "compiled" falls back to "raw" if JAX's internals do not fit.
CALL_PATH = "compiled"


class PersistentCacheError(OSError):
    """The cache directory or key file cannot be used."""


class _BadEntry(Exception):
    """An entry that must not be loaded (the message says why)."""


def _truthy(v) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def _spec_list(specs) -> list:
    import numpy as np
    return [[list(int(d) for d in s.shape), np.dtype(s.dtype).name] for s in specs]


def _environment() -> dict:
    """Versions and platform an entry must match to be loaded."""
    import jax
    import jaxlib
    import torch
    from . import __version__
    client = jax.devices()[0].client
    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "torch": f"{torch.__version__} ({torch.version.git_version})",
        "lazyxla": __version__,
        "platform": client.platform,
        "platform_version": getattr(client, "platform_version", ""),
    }


_CHECKED = ("jax", "jaxlib", "torch", "lazyxla", "platform", "platform_version")


# ---------------------------------------------------------------------------------------
# The HMAC key
def key_file_path() -> tuple[str, bool]:
    """(path of the HMAC key file, shared?): ``$LAZYXLA_CACHE_HMAC_KEY_FILE`` or the user's."""
    shared = os.environ.get(ENV_KEY_FILE, "")
    if shared:
        return os.path.abspath(os.path.expanduser(shared)), True
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "lazyxla", "cache_key"), False


def _read_or_create_key(path: str, shared: bool) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read().strip()
    except FileNotFoundError:
        data = None
    except OSError as e:
        raise PersistentCacheError(f"cannot read the cache HMAC key file {path}: {e}") from None
    if data is None:
        d = os.path.dirname(path)
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".cache_key.", dir=d)  # mode 0600
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(secrets.token_hex(32).encode() + b"\n")
                    f.flush()
                    os.fsync(f.fileno())
                try:
                    os.link(tmp, path)   # atomic, and never replaces a key another process made
                except FileExistsError:
                    pass
            finally:
                os.unlink(tmp)
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


# ---------------------------------------------------------------------------------------
# Entry encoding
def encode_entry(meta: dict, payload: bytes, mac_key: bytes) -> bytes:
    meta_b = json.dumps(meta, sort_keys=True, separators=(",", ":"), default=str).encode()
    body = HEADER.pack(MAGIC, FORMAT_VERSION, len(meta_b), len(payload)) + meta_b + payload
    body += hashlib.sha256(body).digest()
    return body + hmac.new(mac_key, body, hashlib.sha256).digest()


def decode_entry(data: bytes, mac_key: bytes | None) -> tuple[dict, bytes]:
    """(metadata, payload) of an entry; raises _BadEntry. With mac_key None the MAC is not
    checked (listing only: nothing unverified is ever loaded)."""
    n = len(data)
    if n == 0:
        raise _BadEntry("empty file")
    if n < HEADER.size + 2 * DIGEST:
        raise _BadEntry(f"truncated ({n} bytes)")
    magic, version, mlen, plen = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise _BadEntry("not a lazyxla cache entry (bad magic)")
    if version != FORMAT_VERSION:
        raise _BadEntry(f"format version {version}, expected {FORMAT_VERSION}")
    if mlen > MAX_META or HEADER.size + mlen + plen + 2 * DIGEST != n:
        raise _BadEntry(f"size mismatch: header says {HEADER.size + mlen + plen + 2 * DIGEST} bytes, "
                        f"file has {n} (truncated or extended)")
    view = memoryview(data)
    end = n - 2 * DIGEST
    if hashlib.sha256(view[:end]).digest() != data[end:end + DIGEST]:
        raise _BadEntry("checksum mismatch (corrupted)")
    if mac_key is not None:
        mac = hmac.new(mac_key, view[:end + DIGEST], hashlib.sha256).digest()
        if not hmac.compare_digest(mac, data[end + DIGEST:]):
            raise _BadEntry("HMAC does not verify (written by someone without this cache's key)")
    try:
        meta = json.loads(bytes(view[HEADER.size:HEADER.size + mlen]).decode("utf-8"))
    except ValueError as e:
        raise _BadEntry(f"unreadable metadata: {e}") from None
    if not isinstance(meta, dict):
        raise _BadEntry("metadata is not an object")
    return meta, view[HEADER.size + mlen:end]


def _peek_meta(path, size):
    """The metadata of an entry, reading only its header and metadata (for listings; nothing
    read here is trusted or loaded), or None if the entry is malformed."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER.size)
            if len(head) < HEADER.size:
                return None
            magic, version, mlen, plen = HEADER.unpack(head)
            if (magic != MAGIC or version != FORMAT_VERSION or mlen > MAX_META
                    or HEADER.size + mlen + plen + 2 * DIGEST != size):
                return None
            meta = json.loads(f.read(mlen).decode("utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


# ---------------------------------------------------------------------------------------
# Turning a loaded executable back into a callable
class RawProgram:
    """Calls a PJRT LoadedExecutable on jax Arrays (single device): ``fn(*arrays) -> tuple``.

    Checks argument count, shapes and dtypes (PJRT itself only checks byte sizes); donated
    inputs are consumed by the runtime as compiled into the executable.
    """

    __slots__ = ("executable", "specs", "kept", "n_outputs", "_execute", "_handlers", "__weakref__")

    def __init__(self, executable, arg_specs, kept, n_outputs):
        self.executable = executable
        self.specs = [(tuple(s.shape), s.dtype) for s in arg_specs]
        self.kept = None if kept == list(range(len(arg_specs))) else kept
        self.n_outputs = n_outputs
        self._execute = executable.execute_sharded
        self._handlers = [_first] * n_outputs

    def __call__(self, *args):
        specs = self.specs
        if len(args) != len(specs):
            raise TypeError(f"cached program takes {len(specs)} arguments, got {len(args)}")
        for i, (a, (shape, dtype)) in enumerate(zip(args, specs)):
            if a.shape != shape or a.dtype != dtype:
                raise TypeError(f"cached program argument {i} is {dtype}{list(shape)}, "
                                f"got {getattr(a, 'dtype', type(a).__name__)}{list(getattr(a, 'shape', ()))}")
        if self.kept is not None:
            args = [args[i] for i in self.kept]
        return tuple(self._execute(list(args)).consume_with_handlers(self._handlers))


def _first(shards):
    return shards[0]


def _as_compiled(executable, device, meta, arg_specs, n_outputs):
    """A jax.stages.Compiled around a deserialized executable, built the way JAX builds one
    after compiling (its own unpickler does the same from pickled fields). Uses JAX internals
    (pinned by the cache key's jaxlib version); the caller falls back to RawProgram."""
    import numpy as np
    from jax._src import core, stages, tree_util
    from jax._src.interpreters import pxla
    from jax._src.layout import Layout
    from jax.sharding import SingleDeviceSharding

    in_avals = [core.ShapedArray(tuple(s.shape), np.dtype(s.dtype)) for s in arg_specs]
    out_avals = [core.ShapedArray(tuple(shape), np.dtype(dt)) for shape, dt in meta["out_specs"]]
    kept = list(meta["kept_args"])
    donated = set(meta.get("donated", ()))
    sh = SingleDeviceSharding(device)
    kin = [in_avals[i] for i in kept]
    in_sh = [sh] * len(kin)
    xla_in = [Layout.from_pjrt_layout(x) for x in executable.get_parameter_layouts()]
    xla_out = [Layout.from_pjrt_layout(x) for x in executable.get_output_layouts()]
    unloaded = pxla.UnloadedMeshExecutable(
        xla_executable=executable, device_list=_device_list([device]), backend=device.client,
        input_avals=kin, input_shardings=in_sh, output_avals=out_avals,
        output_shardings=[sh] * len(out_avals), committed=False,
        name=str(meta.get("name") or "SyncTensorsGraph"), unordered_effects=[], ordered_effects=[],
        keepalive=[], host_callbacks=[], kept_var_idx=set(kept), mut=None,
        xla_in_layouts=xla_in, dispatch_in_layouts=pxla.get_dispatch_layouts(xla_in, in_sh, kin),
        xla_out_layouts=xla_out, all_args_info=None, pgle_profiler=None)
    args_info = (tuple(stages.ArgInfo(a, i in donated) for i, a in enumerate(in_avals)), {})
    out_tree = tree_util.tree_structure(tuple(range(n_outputs)))
    return stages.Compiled(unloaded.load(), [], args_info, out_tree, no_kwargs=True)


def _device_list(devices):
    from jax._src.lib import xla_client as xc
    return xc.DeviceList(tuple(devices))


# ---------------------------------------------------------------------------------------
class PersistentCache:
    """A directory of compiled programs, one file per graph key (see the module docstring).

    ``max_bytes``: after each store, least recently used entries (by mtime, which a load
    touches) are deleted until the directory's entries total at most this many bytes.
    Raises PersistentCacheError if the directory cannot be used.
    """

    def __init__(self, path, readonly: bool = False, max_bytes: int | None = None):
        self.path = os.path.abspath(os.path.expanduser(os.fspath(path)))
        self.readonly = bool(readonly)
        self.max_bytes = int(max_bytes) if max_bytes else None
        self._mac = None
        self._env = None
        self._hits = {}
        self._stats = {"hits": 0, "misses": 0, "failures": 0, "stores": 0, "store_errors": 0,
                       "skipped": 0, "evictions": 0}
        self._warned_store = False
        self.last_failure = None  # why the last bad entry was rejected
        self.last_call_path = None
        self._check_directory()

    # -- setup ------------------------------------------------------------------------
    def _check_directory(self):
        p = self.path
        if os.path.lexists(p) and not os.path.isdir(p):
            raise PersistentCacheError(f"{p} exists and is not a directory")
        if not os.path.isdir(p):
            if self.readonly:
                raise PersistentCacheError(f"{p} does not exist (read-only cache)")
            try:
                os.makedirs(p, mode=0o700, exist_ok=True)
            except OSError as e:
                raise PersistentCacheError(f"cannot create {p}: {e.strerror or e}") from None
        need = os.R_OK | os.X_OK | (0 if self.readonly else os.W_OK)
        if not os.access(p, need):
            raise PersistentCacheError(f"{p} is not {'readable' if self.readonly else 'writable'}")
        st = os.stat(p)
        self._dir_mode = stat.S_IMODE(st.st_mode)
        sticky_ours = bool(st.st_mode & stat.S_ISVTX) and st.st_uid == os.getuid()
        if st.st_mode & 0o022 and not sticky_ours:
            warnings.warn(f"lazyxla: the persistent cache directory {p} is writable by other users "
                          f"(mode {self._dir_mode:o}); entries they write fail the HMAC check and "
                          f"are recompiled, but they can delete or replace yours", RuntimeWarning,
                          stacklevel=3)

    @property
    def mac_key(self) -> bytes:
        if self._mac is None:
            self._mac = _read_or_create_key(*key_file_path())
        return self._mac

    def entry_path(self, key: bytes) -> str:
        if not isinstance(key, (bytes, bytearray)) or not key:
            raise TypeError(f"cache key must be non-empty bytes, got {type(key).__name__}")
        return os.path.join(self.path, bytes(key).hex())

    # -- load -------------------------------------------------------------------------
    def load(self, key: bytes, arg_specs, n_outputs: int):
        """The program stored under ``key`` as ``fn(*arrays) -> tuple of n_outputs arrays``,
        or None (no entry: ``PersistentCacheMiss``; a bad one: ``PersistentCacheDeserializeFailure``,
        deleted unless read-only). A hit counts ``PersistentCacheHit`` and marks the entry used."""
        path = self.entry_path(key)
        t0 = metrics.now_ns()
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            metrics.counter_inc("PersistentCacheMiss")
            self._stats["misses"] += 1
            return None
        except OSError as e:
            return self._reject(path, f"cannot read: {e}", t0, delete=False)
        try:
            meta, payload = decode_entry(data, self.mac_key)
            self._check_meta(meta, key, arg_specs, n_outputs)
            fn = self._deserialize(meta, payload, arg_specs, n_outputs)
        except _BadEntry as e:
            return self._reject(path, str(e), t0)
        metrics.metric_add("PersistentCacheLoad", metrics.now_ns() - t0, "time")
        metrics.counter_inc("PersistentCacheHit")
        self._stats["hits"] += 1
        h = bytes(key).hex()
        self._hits[h] = self._hits.get(h, 0) + 1
        if not self.readonly:
            try:
                os.utime(path)  # last used, for the size bound's LRU order
            except OSError:
                pass
        return fn

    def _reject(self, path, why, t0, delete=True):
        metrics.metric_add("PersistentCacheLoad", metrics.now_ns() - t0, "time")
        metrics.counter_inc("PersistentCacheDeserializeFailure")
        self._stats["failures"] += 1
        self.last_failure = f"{os.path.basename(path)}: {why}"
        if delete and not self.readonly:
            try:
                os.unlink(path)
            except OSError:
                pass
        return None

    def _check_meta(self, meta, key, arg_specs, n_outputs):
        if meta.get("key") != bytes(key).hex():
            raise _BadEntry(f"entry is for key {meta.get('key')!r}")
        if self._env is None:
            self._env = _environment()
        for k in _CHECKED:
            if meta.get(k) != self._env[k]:
                raise _BadEntry(f"built with {k} {meta.get(k)!r}, this process has {self._env[k]!r}")
        want = _spec_list(arg_specs)
        if meta.get("arg_specs") != want:
            raise _BadEntry(f"argument specs {meta.get('arg_specs')} differ from {want}")
        if meta.get("n_outputs") != n_outputs or len(meta.get("out_specs", ())) != n_outputs:
            raise _BadEntry(f"{meta.get('n_outputs')} outputs, expected {n_outputs}")
        kept = meta.get("kept_args")
        if (not isinstance(kept, list) or kept != sorted(set(kept))
                or any(not isinstance(i, int) or not 0 <= i < len(want) for i in kept)):
            raise _BadEntry("bad kept_args")

    def _deserialize(self, meta, payload, arg_specs, n_outputs):
        import jax
        client = jax.devices()[0].client
        by_id = {d.id: d for d in client.devices()}
        ids = meta.get("devices")
        if not isinstance(ids, list) or len(ids) != 1 or ids[0] not in by_id:
            raise _BadEntry(f"devices {ids!r} are not this process's")
        device = by_id[ids[0]]
        try:
            exe = client.deserialize_executable(bytes(payload), [device])
        except Exception as e:  # noqa: BLE001 - jaxlib raises its own runtime errors
            raise _BadEntry(f"deserialize_executable failed: {type(e).__name__}: {e}") from None
        try:
            n_in, n_out = len(exe.get_parameter_layouts()), len(exe.get_output_layouts())
        except Exception as e:  # noqa: BLE001
            raise _BadEntry(f"loaded executable unusable: {e}") from None
        if n_in != len(meta["kept_args"]) or n_out != n_outputs:
            raise _BadEntry(f"loaded executable takes {n_in} arguments and gives {n_out} outputs")
        if CALL_PATH == "compiled":
            try:
                fn = _as_compiled(exe, device, meta, arg_specs, n_outputs)
                self.last_call_path = "compiled"
                return fn
            except Exception:  # noqa: BLE001 - JAX internals moved: use the plain path
                pass
        self.last_call_path = "raw"
        return RawProgram(exe, arg_specs, list(meta["kept_args"]), n_outputs)

    # -- store ------------------------------------------------------------------------
    def store(self, key: bytes, compiled, meta: dict | None = None) -> None:
        """Write ``compiled`` (a jax.stages.Compiled) under ``key``; ``meta`` (JSON-able) is
        kept as the entry's ``extra``. Never raises for I/O trouble: warns once and goes on.
        Does nothing when read-only or for programs it cannot describe (several devices,
        closed-over constant arguments)."""
        if self.readonly:
            return
        path = self.entry_path(key)
        try:
            described = self._describe(key, compiled, meta)
        except Exception as e:  # noqa: BLE001 - a store failure must not break the compile
            self._stats["skipped"] += 1
            self._warn_store_once(f"cannot store this program: {e}")
            return
        entry_meta, payload = described
        try:
            blob = encode_entry(entry_meta, payload, self.mac_key)
            self._write_atomic(path, blob)
            self._stats["stores"] += 1
            self._evict_and_sweep()
        except OSError as e:
            self._stats["store_errors"] += 1
            self._warn_store_once(f"write to {self.path} failed: {e}")

    def _warn_store_once(self, what):
        if not self._warned_store:
            self._warned_store = True
            warnings.warn(f"lazyxla: persistent cache: {what}", RuntimeWarning, stacklevel=3)

    def _describe(self, key, compiled, meta):
        import jax
        exe = compiled.runtime_executable()
        devices = exe.local_devices()
        if len(devices) != 1:
            raise ValueError(f"it runs on {len(devices)} devices; only single-device programs are kept")
        params = getattr(compiled, "_params", None)
        if params is not None and getattr(params, "const_args", None):
            raise ValueError("it takes closed-over constant arguments")
        infos = jax.tree_util.tree_leaves(compiled.args_info)
        n_args = len(infos)
        kept = getattr(getattr(compiled, "_executable", None), "_kept_var_idx", None)
        kept = sorted(kept) if kept is not None else list(range(n_args))
        outs = jax.tree_util.tree_leaves(compiled.out_info)
        if len(exe.get_parameter_layouts()) != len(kept) or len(exe.get_output_layouts()) != len(outs):
            raise ValueError("its executable's signature does not match its arguments")
        payload = devices[0].client.serialize_executable(exe)
        if self._env is None:
            self._env = _environment()
        m = dict(self._env)
        m.update({
            "format": FORMAT_VERSION,
            "key": bytes(key).hex(),
            "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
            "devices": [d.id for d in devices],
            "created": time.time(),
            "arg_specs": _spec_list(infos),
            "kept_args": kept,
            "donated": [i for i, a in enumerate(infos) if a.donated],
            "out_specs": _spec_list(outs),
            "n_outputs": len(outs),
            "name": (meta or {}).get("name", "SyncTensorsGraph"),
            "extra": dict(meta or {}),
        })
        return m, payload

    def _write_atomic(self, path, blob):
        name = os.path.basename(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.{os.getpid()}.", suffix=".tmp", dir=self.path)
        try:
            # readable by whoever can read the directory, writable by us only
            os.fchmod(fd, 0o600 | (self._dir_mode & 0o044))
            view = memoryview(blob)
            for i in range(0, len(view), _CHUNK_BYTES):
                chunk = view[i:i + _CHUNK_BYTES]
                while chunk:
                    chunk = chunk[os.write(fd, chunk):]
                if _chunk_pause:
                    time.sleep(_chunk_pause)
            os.fsync(fd)
            os.close(fd)
            fd = -1
            os.replace(tmp, path)
            tmp = None
        finally:
            if fd >= 0:
                os.close(fd)
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        try:
            dfd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass

    # -- maintenance ------------------------------------------------------------------
    def _scan(self):
        """[(name, size, mtime)] of entries, and [(name, mtime)] of temp files."""
        entries, temps = [], []
        try:
            names = os.listdir(self.path)
        except OSError:
            return entries, temps
        for n in names:
            is_entry = _ENTRY_RE.match(n) is not None
            if not is_entry and _TEMP_RE.match(n) is None:
                continue
            try:
                st = os.stat(os.path.join(self.path, n), follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if is_entry:
                entries.append((n, st.st_size, st.st_mtime))
            else:
                temps.append((n, st.st_mtime))
        return entries, temps

    def _evict_and_sweep(self):
        entries, temps = self._scan()
        now = time.time()
        for n, mtime in temps:
            if now - mtime > STALE_TEMP_SECONDS:
                self._unlink(n)
        if not self.max_bytes:
            return
        total = sum(s for _, s, _ in entries)
        for n, size, _ in sorted(entries, key=lambda e: e[2]):
            if total <= self.max_bytes:
                break
            if self._unlink(n):
                total -= size
                self._stats["evictions"] += 1

    def _unlink(self, name) -> bool:
        try:
            os.unlink(os.path.join(self.path, name))
            return True
        except OSError:
            return False

    def entries(self) -> list[dict]:
        """One dict per entry, least recently used first: key (hex), size (bytes), created
        (epoch s, from the metadata when readable), age (s), last_used (epoch s: the file's
        mtime, touched on load), hits (loads by this process, or None), ok (header, size and
        metadata are sound; only a load verifies the checksum and the MAC)."""
        out = []
        now = time.time()
        entries, _ = self._scan()
        for n, size, mtime in sorted(entries, key=lambda e: e[2]):
            meta = _peek_meta(os.path.join(self.path, n), size)
            ok = meta is not None and meta.get("key") == n
            created = meta.get("created") if ok else None
            extra = {}
            if ok:
                extra = {k: meta.get(k) for k in ("name", "n_outputs", "jaxlib", "lazyxla")}
                extra["fold"] = (meta.get("extra") or {}).get("fold")  # for recompile explanations
                extra["n_args"] = len(meta.get("arg_specs") or ())
            if not isinstance(created, (int, float)):
                created = mtime
            out.append({"key": n, "size": size, "created": created, "age": now - created,
                        "last_used": mtime, "hits": self._hits.get(n), "ok": ok, **extra})
        return out

    def stats(self) -> dict:
        entries, temps = self._scan()
        return {"path": self.path, "readonly": self.readonly, "max_bytes": self.max_bytes,
                "entries": len(entries), "bytes": sum(s for _, s, _ in entries),
                "temp_files": len(temps), **self._stats}

    def clear(self) -> int:
        """Delete every entry and temp file (nothing else in the directory); returns how many
        entries were deleted. Raises PersistentCacheError when read-only."""
        if self.readonly:
            raise PersistentCacheError(f"{self.path} is a read-only cache; not clearing it")
        entries, temps = self._scan()
        n = sum(self._unlink(name) for name, _, _ in entries)
        for name, _ in temps:
            self._unlink(name)
        self._hits.clear()
        return n

    def __repr__(self):
        return f"PersistentCache({self.path!r}, readonly={self.readonly}, max_bytes={self.max_bytes})"


# ---------------------------------------------------------------------------------------
# The process-wide cache
_INIT_LOCK = threading.Lock()
_initialized = False
_cache: PersistentCache | None = None


def _max_bytes_from_env():
    v = os.environ.get(ENV_MAX_BYTES, "").strip()
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
            path = os.environ.get(ENV_PATH, "")
            cache = None
            if path:
                try:
                    cache = PersistentCache(path, _truthy(os.environ.get(ENV_READ_ONLY, "0")),
                                            _max_bytes_from_env())
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


# ---------------------------------------------------------------------------------------
# `lazyxla cache ls|stats|clear [PATH]`
def cli_arguments(p) -> None:
    p.add_argument("action", choices=("ls", "stats", "clear"),
                   help="ls: list entries; stats: totals; clear: delete every entry")
    p.add_argument("path", nargs="?", default=None,
                   help=f"cache directory (default ${ENV_PATH})")


def _fmt_bytes(n):
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024


def _fmt_age(s):
    s = max(0.0, s)
    for unit, secs in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= secs:
            return f"{s / secs:.1f}{unit}"
    return f"{s:.0f}s"


def cli(args) -> int:
    import sys
    path = args.path or os.environ.get(ENV_PATH, "")
    if not path:
        print(f"lazyxla cache: no cache directory given and ${ENV_PATH} is not set", file=sys.stderr)
        return 2
    if not os.path.isdir(path):
        print(f"lazyxla cache: {path} is not a directory", file=sys.stderr)
        return 2
    try:
        cache = PersistentCache(path, readonly=args.action != "clear")
    except PersistentCacheError as e:
        print(f"lazyxla cache: {e}", file=sys.stderr)
        return 2
    if args.action == "ls":
        ents = cache.entries()
        now = time.time()
        print(f"{'key':<34} {'size':>9} {'age':>7} {'last used':>9} {'hits':>4}  program")
        for e in ents:
            what = (f"{e.get('name')} ({e.get('n_args')} args, {e.get('n_outputs')} outputs)"
                    if e["ok"] else "unreadable entry")
            hits = "-" if e["hits"] is None else str(e["hits"])
            print(f"{e['key']:<34} {_fmt_bytes(e['size']):>9} {_fmt_age(e['age']):>7} "
                  f"{_fmt_age(now - e['last_used']) + ' ago':>9} {hits:>4}  {what}")
        print(f"{len(ents)} entries, {_fmt_bytes(sum(e['size'] for e in ents))} in {cache.path}")
    elif args.action == "stats":
        st = cache.stats()
        ents = cache.entries()
        print(f"path:       {st['path']}")
        print(f"entries:    {st['entries']}")
        print(f"bytes:      {st['bytes']} ({_fmt_bytes(st['bytes'])})")
        print(f"temp files: {st['temp_files']}")
        print(f"unreadable: {sum(1 for e in ents if not e['ok'])}")
        if ents:
            print(f"oldest:     {_fmt_age(max(e['age'] for e in ents))}")
            print(f"newest:     {_fmt_age(min(e['age'] for e in ents))}")
        mb = _max_bytes_from_env()
        print(f"max bytes:  {mb if mb else 'unbounded'} (${ENV_MAX_BYTES})")
    else:
        n = cache.clear()
        print(f"removed {n} entries from {cache.path}")
    return 0
