"""128-bit hashes and folds used by every key in lazyxla.

A hash is 16 bytes. ``fold(a, b, ...)`` is BLAKE2b with a 16-byte digest over the
concatenation of its byte-string parts: one-way, and identical across processes and
machines (no Python ``hash()`` anywhere), which the persistent cache relies on.
``encode`` turns the plain values that appear in op parameters (ints, floats, complex, bools,
strings, dtypes, tuples, None) into canonical bytes.

Touches nothing but its arguments.
"""
from __future__ import annotations

import hashlib
import struct

import torch

__all__ = ["fold", "merge", "encode"]

_blake2b = hashlib.blake2b


def fold(*parts: bytes) -> bytes:
    """One-way 128-bit fold of byte strings, in order."""
    return _blake2b(b"".join(parts), digest_size=16).digest()


def merge(acc: bytes, ingredient: bytes) -> bytes:
    """MergeHash: fold one more ingredient into a running 128-bit digest."""
    return _blake2b(acc + ingredient, digest_size=16).digest()


def encode(v) -> bytes:
    """Canonical bytes of a parameter value; distinct types never collide."""
    t = type(v)
    if t is bool:
        return b"b1" if v else b"b0"
    if t is int:
        return b"i" + str(v).encode() + b";"
    if t is float:
        return b"f" + struct.pack("<d", v)
    if t is complex:
        return b"c" + struct.pack("<dd", v.real, v.imag)
    if t is str:
        b = v.encode()
        return b"s" + str(len(b)).encode() + b":" + b
    if v is None:
        return b"n"
    if t is tuple or t is list or isinstance(v, torch.Size):
        return b"(" + b"".join(encode(x) for x in v) + b")"
    if t is torch.dtype or t is torch.memory_format or t is torch.layout or t is torch.device:
        return b"t" + str(v).encode() + b";"
    if t is bytes:
        return b"y" + str(len(v)).encode() + b":" + v
    enc = getattr(v, "__lazyxla_encode__", None)
    if enc is not None:
        return enc()
    raise TypeError(f"lazyxla cannot hash a parameter of type {t.__name__}: {v!r}")
