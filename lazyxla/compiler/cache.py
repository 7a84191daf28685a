"""The in-memory compilation cache: an LRU of compiled programs keyed by graph hash (R6).

Capacity is ``XLA_COMPILATION_CACHE_SIZE`` (default 2048), read once when the cache is first
made; the least recently used entry is evicted on overflow (``evictions`` counts them). Touches nothing else.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from ..config import env_int


@dataclass
class CachedProgram:
    """A compiled program and what it was compiled from (for diagnostics)."""
    executable: object
    key: bytes
    trace: object              # graph_hash.FoldTrace of the lookup that compiled it
    n_params: int
    n_outputs: int
    graph_size: int
    compile_ns: int
    donated: tuple = ()
    hits: int = 0
    checks: tuple = ()         # value checks: (op, user line, message, error kind), one per row
    #                            of the program's last output (``lowering.program``)
    extra: dict = field(default_factory=dict)
    retired: bool = False      # a better program should stand for the same key now: a lookup that
    #                            finds this entry treats it as a miss (``dynamic.PaddedCall.ran``)


class LRUCache:
    def __init__(self, capacity: int):
        self.capacity = max(1, int(capacity))
        self._d: OrderedDict = OrderedDict()
        self.evictions = 0

    def get(self, key):
        e = self._d.get(key)
        if e is not None:
            self._d.move_to_end(key)
        return e

    def add(self, key, value):
        if key in self._d:
            self._d.move_to_end(key)
            return self._d[key]
        self._d[key] = value
        while len(self._d) > self.capacity:
            self._d.popitem(last=False)
            self.evictions += 1
        return value

    def __len__(self):
        return len(self._d)

    def __contains__(self, key):
        return key in self._d

    def values(self):
        return list(self._d.values())

    def clear(self):
        self._d.clear()


_CACHE = None


def computation_cache() -> LRUCache:
    global _CACHE
    if _CACHE is None:
        _CACHE = LRUCache(env_int("XLA_COMPILATION_CACHE_SIZE", 2048))
    return _CACHE
