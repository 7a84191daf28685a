"""``lazyxla cache ls|stats|clear [PATH]``: look at or empty a persistent compilation cache.

PATH defaults to ``$XLA_PERSISTENT_CACHE_PATH``. ``ls`` lists the entries (key, size, age, last
use, program), ``stats`` prints the totals, ``clear`` deletes every entry and temp file (nothing
else in the directory). ``ls`` and ``stats`` open the cache read-only.

May touch: the cache directory (``clear`` only) and, through ``lazyxla.compiler.persistent_cache``, the
HMAC key file when ``clear`` opens the cache; reads the environment for the defaults.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from ..config import env_str
from ..metrics import format_bytes
from ..compiler.persistent_cache import ENV_MAX_BYTES, ENV_PATH, PersistentCache, PersistentCacheError, max_bytes_from_env


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("ls", "stats", "clear"),
                   help="ls: list entries; stats: totals; clear: delete every entry")
    p.add_argument("path", nargs="?", default=None,
                   help=f"cache directory (default ${ENV_PATH})")


def _fmt_bytes(n) -> str:
    """A size as the listing prints it: ``512B``, ``3.5KB``, ``1.2GB``."""
    return format_bytes(n, digits=1, whole_bytes=True)


def _fmt_age(s) -> str:
    s = max(0.0, s)
    for unit, secs in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= secs:
            return f"{s / secs:.1f}{unit}"
    return f"{s:.0f}s"


def run(args) -> int:
    """The ``lazyxla cache`` subcommand; 2 when there is no usable cache directory."""
    path = args.path or env_str(ENV_PATH)
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
        mb = max_bytes_from_env()
        print(f"max bytes:  {mb if mb else 'unbounded'} (${ENV_MAX_BYTES})")
    else:
        n = cache.clear()
        print(f"removed {n} entries from {cache.path}")
    return 0
