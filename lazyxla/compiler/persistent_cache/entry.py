"""One persistent cache entry on disk: its format, and the checks that decide whether it may
be loaded (R7).

Entry file format (version 1), all integers little-endian::

    header   24 bytes   magic b"LZXLAPC\\0", u32 format version, u32 metadata length,
                        u64 executable length
    metadata            UTF-8 JSON object: key, versions (jax, jaxlib, torch, lazyxla),
                        XLA_FLAGS, platform, devices, created time, argument specs, kept
                        arguments, donated arguments, output specs, n_outputs, caller's extras
    payload             the executable, as serialized by the PJRT client
    checksum 32 bytes   SHA-256 of header + metadata + payload (catches accidents)
    mac      32 bytes   HMAC-SHA256 under the cache's key (``hmac_key``) of everything before
                        it (catches other writers)

``encode_entry`` builds one; ``decode_entry`` checks size, checksum and MAC and returns the
metadata and payload, or raises ``_BadEntry`` saying why; ``peek_meta`` reads only the metadata,
for listings (nothing it reads is trusted). Nothing is ever unpickled.

May touch: the entry file ``peek_meta`` is given (read only); nothing else.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import struct

import numpy as np

MAGIC = b"LZXLAPC\x00"
FORMAT_VERSION = 1
HEADER = struct.Struct("<8sIIQ")  # magic, format version, metadata length, payload length
DIGEST = 32                       # SHA-256 and HMAC-SHA256 sizes
MAX_META = 1 << 20


class _BadEntry(Exception):
    """An entry that must not be loaded (the message says why)."""


def spec_list(specs) -> list:
    """Argument or output specs (objects with ``shape`` and ``dtype``) as the metadata keeps
    them: ``[[dims...], dtype name]`` each."""
    return [[list(int(d) for d in s.shape), np.dtype(s.dtype).name] for s in specs]


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


def peek_meta(path, size):
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
