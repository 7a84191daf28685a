"""A persistent cache directory: ``PersistentCache`` loads, stores, evicts and lists compiled
programs, one entry file per graph key (R7).

``load(key, arg_specs, n_outputs)`` (``load_checked``: with the program's value checks) returns a callable that runs like the
``jax.stages.Compiled`` that was stored (``fn(*arrays) -> tuple``, donation included), or None
on a miss or a bad entry; ``store(key, compiled, meta)`` writes one. An entry is handed to
``deserialize_executable`` only after its size, checksum and MAC verify (``entry``) and its
metadata matches the key, the compile environment (versions and platform,
``xla.compile_environment``), the argument specs asked for and, for a sharded program, its
devices and argument layouts. Any other entry (empty,
truncated, garbage, bit-flipped, foreign MAC, mismatched metadata) counts
``PersistentCacheDeserializeFailure``, is deleted unless read-only, and is a miss: the caller
recompiles and stores again. Writes are atomic (``files.write_atomic``): concurrent writers of
one key leave the last complete file, and a writer killed mid-write leaves only a temp file,
never an entry. A loaded executable is called through a rebuilt ``jax.stages.Compiled``
(``jax_internals``), or through ``RawProgram`` when JAX's internals do not fit (single-device
programs only: a sharded one that cannot be rebuilt is a miss).

May touch:
- the cache directory: entry files named ``<key hex>`` and, while being written, temp files
  ``.<key hex>.<pid>.<random>.tmp`` (renamed into place, or swept when stale); nothing else in
  the directory is read, changed or deleted. Read-only mode writes, touches and deletes nothing
  there.
- the file ``checked-signatures`` in the cache directory: the signature checks (an op's
  lowering traced abstractly for its input shapes, ``signature``) that passed in an earlier
  process, one HMAC-signed 16-byte key per record, appended (``was_checked``,
  ``remember_checked``); ``clear`` empties it with the entries.
- the HMAC key file (``hmac_key``), on first use.
- counters ``PersistentCacheMiss``, ``PersistentCacheHit``, ``PersistentCacheDeserializeFailure``
  and the timed metric ``PersistentCacheLoad`` (``lazyxla.metrics``).
"""
from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
import time
import warnings

import jax

from ...xla import jax_internals
from ... import metrics
from ...xla import client as xla
from ...config import env_str
from ...files import write_atomic
from .entry import FORMAT_VERSION, _BadEntry, decode_entry, encode_entry, peek_meta, spec_list
from .hmac_key import PersistentCacheError, key_file_path, read_or_create_key

CHECKS_FILE = "checked-signatures"  # remembered signature checks (not an entry: not hex)
STALE_TEMP_SECONDS = 3600         # temp files older than this are a dead writer's; swept on store

_ENTRY_RE = re.compile(r"^[0-9a-f]{2,256}$")
_TEMP_RE = re.compile(r"^\.[0-9a-f]{2,256}\.\d+\.[A-Za-z0-9_]+\.tmp$")  # write_atomic's temp names

# Writing in chunks lets a test kill a writer mid-file; ``_chunk_pause`` is 0 outside tests.
_CHUNK_BYTES = 1 << 20
_chunk_pause = 0.0

# Which way a loaded executable is called: "compiled" rebuilds a jax.stages.Compiled around it
# (JAX's C++ dispatch fast path, argument checks); "raw" calls LoadedExecutable.execute_sharded.
# "compiled" falls back to "raw" if JAX's internals do not fit.
CALL_PATH = "compiled"

# The compile environment an entry must match to load (same names in the entry's metadata).
_CHECKED = ("jax", "jaxlib", "torch", "lazyxla", "platform", "platform_version")


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


def _chunks(blob):
    """``blob`` in ``_CHUNK_BYTES`` pieces, pausing ``_chunk_pause`` seconds after each."""
    view = memoryview(blob)
    for i in range(0, len(view), _CHUNK_BYTES):
        yield view[i:i + _CHUNK_BYTES]
        if _chunk_pause:
            time.sleep(_chunk_pause)


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
        self._hits = {}
        self._stats = {"hits": 0, "misses": 0, "failures": 0, "stores": 0, "store_errors": 0,
                       "skipped": 0, "evictions": 0}
        self._warned_store = False
        self.last_failure = None  # why the last bad entry was rejected
        self.last_call_path = None
        self._checked = None  # the remembered signature checks, read at the first question
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
            self._mac = read_or_create_key(*key_file_path())
        return self._mac

    def entry_path(self, key: bytes) -> str:
        if not isinstance(key, (bytes, bytearray)) or not key:
            raise TypeError(f"cache key must be non-empty bytes, got {type(key).__name__}")
        return os.path.join(self.path, bytes(key).hex())

    # -- load -------------------------------------------------------------------------
    def load(self, key: bytes, arg_specs, n_outputs: int):
        """The program stored under ``key`` as ``fn(*arrays) -> tuple of n_outputs arrays``, or
        None (``load_checked``, for a program stored without value checks)."""
        got = self.load_checked(key, arg_specs, n_outputs)
        return None if got is None else got[0]

    def load_checked(self, key: bytes, arg_specs, n_outputs: int):
        """(fn, checks) for the program stored under ``key``: ``fn(*arrays)`` gives n_outputs
        arrays, and one more, the rows of its value checks, when ``checks`` (``lowering.program``)
        is not empty; or None (no entry: ``PersistentCacheMiss``; a bad one:
        ``PersistentCacheDeserializeFailure``, deleted unless read-only). A hit counts
        ``PersistentCacheHit`` and marks the entry used."""
        path = self.entry_path(key)
        if not os.path.lexists(path):
            return self._miss()
        with metrics.timed("PersistentCacheLoad"):
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:  # removed since (another process's eviction)
                return self._miss()
            except OSError as e:
                return self._reject(path, f"cannot read: {e}", delete=False)
            try:
                meta, payload = decode_entry(data, self.mac_key)
                checks = tuple(tuple(c) for c in ((meta.get("extra") or {}).get("checks") or ()))
                total = n_outputs + (1 if checks else 0)  # value checks: one more output
                self._check_meta(meta, key, arg_specs, total)
                fn = self._deserialize(meta, payload, arg_specs, total)
            except _BadEntry as e:
                return self._reject(path, str(e))
        metrics.counter_inc("PersistentCacheHit")
        self._stats["hits"] += 1
        h = bytes(key).hex()
        self._hits[h] = self._hits.get(h, 0) + 1
        if not self.readonly:
            try:
                os.utime(path)  # last used, for the size bound's LRU order
            except OSError:
                pass
        return fn, checks

    def _miss(self):
        metrics.counter_inc("PersistentCacheMiss")
        self._stats["misses"] += 1
        return None

    def _reject(self, path, why, delete=True):
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
        env = xla.compile_environment()
        for k in _CHECKED:
            if meta.get(k) != env[k]:
                raise _BadEntry(f"built with {k} {meta.get(k)!r}, this process has {env[k]!r}")
        want = spec_list(arg_specs)
        if meta.get("arg_specs") != want:
            raise _BadEntry(f"argument specs {meta.get('arg_specs')} differ from {want}")
        if meta.get("n_outputs") != n_outputs or len(meta.get("out_specs", ())) != n_outputs:
            raise _BadEntry(f"{meta.get('n_outputs')} outputs, expected {n_outputs}")
        kept = meta.get("kept_args")
        if (not isinstance(kept, list) or kept != sorted(set(kept))
                or any(not isinstance(i, int) or not 0 <= i < len(want) for i in kept)):
            raise _BadEntry("bad kept_args")

    def _deserialize(self, meta, payload, arg_specs, n_outputs):
        client = xla.jax_device().client
        by_id = {d.id: d for d in client.devices()}
        ids = meta.get("devices")
        if not isinstance(ids, list) or not ids or any(i not in by_id for i in ids):
            raise _BadEntry(f"devices {ids!r} are not this process's")
        devices = [by_id[i] for i in ids]
        in_shardings = None
        if len(devices) > 1:  # a sharded program: it runs on these devices with these layouts
            in_shardings = [s.sharding for s in arg_specs]
            have = [None if sh is None else jax_internals.hlo_sharding_text(sh, len(s.shape))
                    for sh, s in zip(in_shardings, arg_specs)]
            if have != meta.get("in_shardings"):
                raise _BadEntry(f"argument shardings {meta.get('in_shardings')} differ from {have}")
        try:
            exe = client.deserialize_executable(bytes(payload), devices)
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
                out_shardings = jax_internals.out_shardings_of(exe, devices) if in_shardings else None
                fn = jax_internals.compiled_from_executable(
                    exe, devices, str(meta.get("name") or "SyncTensorsGraph"),
                    [(tuple(s.shape), s.dtype) for s in arg_specs], meta["out_specs"],
                    list(meta["kept_args"]), set(meta.get("donated", ())), in_shardings, out_shardings)
                self.last_call_path = "compiled"
                return fn
            except jax_internals.JaxInternalsChanged as e:  # JAX moved: use the plain path
                if in_shardings:
                    raise _BadEntry(f"a sharded program loads only through JAX's Compiled: {e}") from None
        self.last_call_path = "raw"
        return RawProgram(exe, arg_specs, list(meta["kept_args"]), n_outputs)

    # -- store ------------------------------------------------------------------------
    def store(self, key: bytes, compiled, meta: dict | None = None) -> None:
        """Write ``compiled`` (a jax.stages.Compiled) under ``key``; ``meta`` (JSON-able) is
        kept as the entry's ``extra``. Never raises for I/O trouble: warns once and goes on.
        Does nothing when read-only or for programs it cannot describe (closed-over constant
        arguments). A sharded program keeps its devices and its argument layouts."""
        if self.readonly:
            return
        path = self.entry_path(key)
        try:
            entry_meta, payload = self._describe(key, compiled, meta)
        except Exception as e:  # noqa: BLE001 - a store failure must not break the compile
            self._stats["skipped"] += 1
            self._warn_store_once(f"cannot store this program: {e}")
            return
        try:
            blob = encode_entry(entry_meta, payload, self.mac_key)
            # readable by whoever can read the directory, writable by us only
            write_atomic(path, _chunks(blob), mode=0o600 | (self._dir_mode & 0o044))
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
        exe = compiled.runtime_executable()
        devices = exe.local_devices()
        if jax_internals.has_constant_arguments(compiled):
            raise ValueError("it takes closed-over constant arguments")
        infos = jax.tree_util.tree_leaves(compiled.args_info)
        kept = jax_internals.kept_arguments(compiled, len(infos))
        outs = jax.tree_util.tree_leaves(compiled.out_info)
        in_shardings = None
        if len(devices) > 1:
            in_shardings = [jax_internals.hlo_sharding_text(sh, len(a.shape))
                            for sh, a in zip(jax.tree_util.tree_leaves(compiled.input_shardings), infos)]
        if len(exe.get_parameter_layouts()) != len(kept) or len(exe.get_output_layouts()) != len(outs):
            raise ValueError("its executable's signature does not match its arguments")
        payload = devices[0].client.serialize_executable(exe)
        env = xla.compile_environment()
        m = {k: env[k] for k in _CHECKED}
        m.update({
            "format": FORMAT_VERSION,
            "key": bytes(key).hex(),
            "XLA_FLAGS": env_str("XLA_FLAGS"),
            "devices": [d.id for d in devices],
            "in_shardings": in_shardings,
            "created": time.time(),
            "arg_specs": spec_list(infos),
            "kept_args": kept,
            "donated": [i for i, a in enumerate(infos) if a.donated],
            "out_specs": spec_list(outs),
            "n_outputs": len(outs),
            "name": (meta or {}).get("name", "SyncTensorsGraph"),
            "extra": dict(meta or {}),
        })
        return m, payload

    # -- remembered signature checks ---------------------------------------------------
    def _check_record(self, key: bytes) -> bytes:
        return key + hmac.new(self.mac_key, b"checked-signature" + key, hashlib.sha256).digest()[:16]

    def was_checked(self, key: bytes) -> bool:
        """Whether a signature check with this 16-byte key passed in an earlier process (or this
        one). Records whose MAC does not verify (another user's, a torn write) are ignored."""
        if self._checked is None:
            self._checked = set()
            try:
                with open(os.path.join(self.path, CHECKS_FILE), "rb") as f:
                    data = f.read()
            except OSError:
                data = b""
            for i in range(0, len(data) - 31, 32):
                rec = data[i:i + 32]
                if hmac.compare_digest(self._check_record(rec[:16]), rec):
                    self._checked.add(rec[:16])
        return key in self._checked

    def remember_checked(self, key: bytes) -> None:
        """Record that the signature check ``key`` passed (one appended record; nothing when
        read-only)."""
        if self.was_checked(key):
            return
        self._checked.add(key)
        if self.readonly:
            return
        try:  # a 32-byte append is one write: concurrent processes do not interleave records
            fd = os.open(os.path.join(self.path, CHECKS_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, self._check_record(key))
            finally:
                os.close(fd)
        except OSError:
            pass  # only a saving lost: the check runs again in the next process

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
            meta = peek_meta(os.path.join(self.path, n), size)
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
        self._unlink(CHECKS_FILE)
        self._checked = None
        self._hits.clear()
        return n

    def __repr__(self):
        return f"PersistentCache({self.path!r}, readonly={self.readonly}, max_bytes={self.max_bytes})"
