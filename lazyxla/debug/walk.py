"""The code walk (``lazyxla explain --walk``): one sync of a user's run, stage by stage through
lazyxla's executor, beside the values that sync really had.

``Walker`` subscribes to the executor's events (``events``) while a script runs. Every lookup
(a sync, or a value read: each program the executor looks up) gets a row in the run's list; the
one walked (the last by default, the N-th, or the last of a graph hash: ``pick``) also keeps what
each stage saw, taken when it happened:

- **cache**: the LRU's capacity (``XLA_COMPILATION_CACHE_SIZE``), entries, hits, misses and
  evictions; the persistent cache's directory and read-only state;
- **arena**: the live tensors, each with the user's line that made it (``storage.watch_births``),
  pending IR or device data, which were synced and why the others were not;
- **rng**: the host seed before and after, and the seed's chain in this graph;
- **hash**: the six merges with each ingredient and the digest after it;
- **lookup**: hit or compile, ``CachedCompile`` / ``UncachedCompile`` before and after, and for
  a recompile its explanation (``debug.explain``);
- **donation**: every parameter, donated or not and why; the seed's counterexample;
- **lowering**: the program text, sharding annotations, parameter wrapping;
- **execute**: compile and execute time, the buffers that came back.

``STAGES`` names, for each stage, the lazyxla function that does it and a piece of the line that
does the work; ``stage_source`` reads it from the installed package when the page is written, so
the page shows the code as it is, and raises ``WalkSourceError`` when a function moved without
the walk following. ``Walker.export()`` gives the page's data (``walk_page`` renders it).

May touch: the event lists and the arena's birth hook while it records (``start`` / ``stop``);
it waits for each walked program to finish (so the execute time is that program's own); it
reads the caches, the metrics and the RNG state.
"""
from __future__ import annotations

import collections
import importlib
import inspect
import os
from dataclasses import dataclass

import numpy as np

from .. import events, metrics
from ..compiler import persistent_cache
from ..ir import rng
from ..run import storage
from ..compiler.cache import computation_cache
from ..compiler.compile import WRAP_THRESHOLD, hlo_text
from ..config import env_str
from ..run.execution import Placeholder
from ..engine.executor import PARAM_ALIASING, buffer_donors
from ..keys.graph_hash import SITES
from ..ir.user_line import fmt_where, resolve_site, user_site
from ..run.storage import SHARDING_OP
from ..xla.client import auto_sharding
from . import explain

ORDER = ("cache", "arena", "rng", "hash", "lookup", "donation", "lowering", "execute")
SEED_OP = "lazyxla::seed_next"
ROW_LIMIT = 400  # live tensors and parameters listed per stage


class WalkSourceError(RuntimeError):
    """A stage's function, or its working line, is no longer where ``STAGES`` says."""


@dataclass(frozen=True)
class Stage:
    name: str
    title: str
    module: str    # "lazyxla.compiler.cache"
    function: str  # the function's qualified name in the module
    marks: str     # a piece of the line that does the work (its first line with it is marked)
    what: str      # what the stage does, in one sentence


STAGES = (
    Stage("cache", "The compilation cache", "lazyxla.compiler.cache", "computation_cache",
          'env_int("XLA_COMPILATION_CACHE_SIZE"',
          "Compiled programs are kept in one LRU, sized once by XLA_COMPILATION_CACHE_SIZE (default 2048); "
          "XLA_PERSISTENT_CACHE_PATH adds a directory that outlives the process, "
          "XLA_PERSISTENT_CACHE_READ_ONLY stops it being written."),
    Stage("arena", "The arena of live tensors", "lazyxla.run.storage", "pending",
          "if st.data is None:",
          "A sync takes every live tensor whose storage still holds pending IR, in the order the tensors were "
          "made; a value read takes only the tensors read."),
    Stage("rng", "The random seed, a small graph of its own", "lazyxla.ir.rng", "next_seed",
          "_seed_ir = (Node(_NEXT, (current(),)), 0)",
          "Each random op extends a chain seed' = 2531011 + 214013 * seed in IR from one device-data seed, so "
          "the program depends on how many random ops it has, never on the seed's value; each sync moves the "
          "host seed on (seed' = 1012031 + seed * 7012063 mod 2^64)."),
    Stage("hash", "The graph hash: six merge sites", "lazyxla.keys.graph_hash", "compute",
          "h = ingredient if h is None else merge(h, ingredient)",
          "The key is folded from force_ltc_data, the environment, each synced tensor's root hash, the "
          "parameter sequence, the donated indices (when any) and the auto-sharding flag, in that order; a "
          "change at any merge changes every digest after it."),
    Stage("lookup", "The lookup: compile or reuse", "lazyxla.engine.executor", "lookup",
          'metrics.counter_inc("UncachedCompile")',
          "The key is looked up in memory, then in the persistent cache; a miss compiles (UncachedCompile), "
          "a hit reuses (CachedCompile)."),
    Stage("donation", "Buffer donation and its one safe condition", "lazyxla.engine.executor", "buffer_donors",
          "id(st) in synced_ids",
          "Only at a step barrier (a sync: force_ltc_data true) may an input buffer be donated, and only one "
          "whose tensor is also written by this very program (or that the user marked): nothing can read the "
          "old buffer afterwards."),
    Stage("lowering", "Lowering: the program, its shardings, parameter wrapping", "lazyxla.compiler.compile",
          "compile_graph", "tupled_parameters(wrap_allowed and len(args) >= WRAP_THRESHOLD)",
          "The post-order becomes one XLA program through jax.jit; parameters are passed as one tuple at or "
          "above XLA_PARAMETER_WRAPPING_THREADSHOLD (3200); sharding annotations ride on the values."),
    Stage("execute", "Execute: the one call that costs the time", "lazyxla.run.execution", "run",
          "outs = executable(*args)",
          "The program is called on the parameters' buffers; its outputs become the synced tensors' device "
          "data (a sync) or the values read (a read)."),
)
_BY_NAME = {s.name: s for s in STAGES}


def _package_root() -> str:
    """The folder that holds the ``lazyxla`` package (this file is ``lazyxla/debug/walk.py``)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def stage_source(stage: Stage) -> dict:
    """The stage's function as it is in the installed package: file (``lazyxla/<module>.py``),
    first line, its lines, and the marked line (the first containing ``stage.marks``)."""
    try:
        obj = importlib.import_module(stage.module)
        for part in stage.function.split("."):
            obj = getattr(obj, part)
        obj = inspect.unwrap(obj)
        lines, start = inspect.getsourcelines(obj)
        path = inspect.getsourcefile(obj)
    except (ImportError, AttributeError, OSError, TypeError) as e:
        raise WalkSourceError(f"the walk's {stage.name} stage names {stage.module}.{stage.function}, which "
                              f"cannot be read ({type(e).__name__}: {e}); update lazyxla.debug.walk.STAGES") from e
    hits = [i for i, line in enumerate(lines) if stage.marks in line]
    if not hits:
        raise WalkSourceError(f"the walk's {stage.name} stage: {stage.module}.{stage.function} has no line with "
                              f"{stage.marks!r} any more; update lazyxla.debug.walk.STAGES")
    rel = os.path.relpath(os.path.abspath(path), _package_root()).replace(os.sep, "/")
    mark = start + hits[0]
    return {"file": rel, "function": f"{stage.module}.{stage.function}", "start": start,
            "lines": [line.rstrip("\n") for line in lines], "mark": mark, "source": f"{rel}:{mark}"}


# ---------------------------------------------------------------------------------------
def _dtype(d) -> str:
    return str(d).replace("torch.", "")


def _shape(shape) -> str:
    return "[" + ", ".join(str(int(x)) for x in shape) + "]"


def _as_int64(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= (1 << 63) else v


def _counter(name) -> int:
    return metrics.counter_value(name) or 0


def _where(w) -> str | None:
    return fmt_where(w) if w else None


class Walker:
    """Records the run's lookups and the walked one's stages (see the module's docstring).
    ``pick``: None (the last lookup), an int N (the N-th, 1-based; negative counts from the end)
    or a string (a graph hash or its first hex digits: the last lookup of that key)."""

    def __init__(self, pick=None):
        self.pick = pick
        self.rows = []          # one per lookup: n, cause, hash, outcome, ops, where
        self.kept = None        # the walked lookup's snapshot (a dict)
        self._ring = collections.deque(maxlen=-pick if isinstance(pick, int) and pick < 0 else 1)
        self._open = None       # the snapshot of the latest lookup, until its step ends
        self._pre = None        # a snapshot begun before a compile (kept if the compile raises)
        self.born = {}          # tensor id -> the user's site that made it
        self.steps = 0
        self._stopped = False
        self._end = None

    # -- recording ------------------------------------------------------------------------
    def start(self):
        events.subscribe(self)
        storage.watch_births(self._birth)
        return self

    def stop(self):
        """Stop recording (again: nothing); keeps the state at the end of the run (the arena,
        the cache, the seed), which the page shows when no lookup is walked."""
        if self._stopped:
            return
        self._stopped = True
        storage.watch_births(None)
        events.unsubscribe(self)
        self._flush_failed()
        self._end = self._end_state()

    def _birth(self, state):
        self.born[state.uid] = user_site(1)

    def _wanted(self, n, key_hex) -> bool:
        p = self.pick
        if p is None or (isinstance(p, int) and p < 0):
            return True
        if isinstance(p, int):
            return n == p
        return key_hex.startswith(str(p).lower())

    def _keep(self, snap):
        if isinstance(self.pick, int) and self.pick < 0:
            self._ring.append(snap)
            self.kept = self._ring[0] if len(self._ring) == self._ring.maxlen else None
        else:
            self.kept = snap

    def _add_row(self, snap):
        self.rows.append({"n": snap["n"], "cause": snap["cause"], "hash": snap["hash"], "outcome": snap["outcome"],
                          "ops": snap["ops"], "where": snap["where"]})

    def _flush_failed(self, graph=None):
        """A snapshot begun before a compile that never reached its lookup's end: that compile
        raised (and the script went on, or ended). It becomes a failed lookup of its own."""
        snap = self._pre
        if snap is not None and snap["graph"] is not graph:
            self._pre = None
            snap["outcome"] = "failed"
            self._add_row(snap)
            self._keep(snap)

    def before_compile(self, cause, trace, graph):
        self._flush_failed()
        n = len(self.rows) + 1
        if self._wanted(n, trace.hex):
            self._pre = self._snapshot(n, cause, trace, graph, None, "compiling")

    def after_lookup(self, cause, trace, prog, graph, compiled):
        self._open = None
        self._flush_failed(graph)
        n = len(self.rows) + 1
        outcome = "compile" if compiled else ("persistent" if prog.extra.get("persistent") else "hit")
        snap, self._pre = self._pre, None
        if snap is not None and snap["graph"] is graph:
            snap.update(outcome=outcome, prog=prog, donors=tuple(prog.donated))
            snap["lookup"]["after"] = (_counter("CachedCompile"), _counter("UncachedCompile"))
            snap["cache"] = self._cache()
        elif self._wanted(n, trace.hex):
            snap = self._snapshot(n, cause, trace, graph, prog, outcome)
        else:
            snap = {"n": n, "cause": cause, "hash": trace.hex, "outcome": outcome, "ops": graph.n_ops,
                    "where": _where(self._call_site())}
            self._add_row(snap)
            return
        self._add_row(snap)
        self._keep(snap)
        self._open = snap
        if len(self.born) > 4 * len(storage.LIVE) + 10000:
            self.born = {u: s for u, s in self.born.items() if u in storage.LIVE}

    def after_run(self, prog, graph, outs):
        snap = self._open
        if snap is None or snap.get("graph") is not graph:
            return
        done = None
        for o in outs:
            if type(o) is Placeholder:
                done = o.completion
                break
        err = done.wait() if done is not None else None
        if err is not None and self.rows and self.rows[-1]["n"] == snap["n"]:
            self.rows[-1]["outcome"] += ", failed running"
        ex = metrics.metric_data("ExecuteTime")
        snap["execute"] = {"ns": (ex[2][-1][1] if ex and ex[2] else None), "error": str(err) if err else None,
                           "outputs": [self._buffer(o) for o in outs]}

    def after_step(self):
        self.steps += 1
        snap, self._open = self._open, None
        if snap is not None and snap["cause"] == "sync":
            snap["rng"]["after"] = rng._seed

    # -- what each stage saw ----------------------------------------------------------------
    @staticmethod
    def _call_site():
        site = user_site(1)
        return resolve_site(site) if site else None

    def _snapshot(self, n, cause, trace, graph, prog, outcome) -> dict:
        tensor_uids = [st.detail[0] for st in trace.steps if st.site == "tensors" and st.detail is not None]
        before = (_counter("CachedCompile"), _counter("UncachedCompile"))
        if outcome in ("hit", "persistent"):
            before = (before[0] - 1, before[1])
        elif outcome == "compile":
            before = (before[0], before[1] - 1)
        snap = {"n": n, "cause": cause, "hash": trace.hex, "outcome": outcome, "ops": graph.n_ops,
                "where": _where(self._call_site()), "trace": trace, "graph": graph, "prog": prog,
                "donors": tuple(prog.donated) if prog is not None else None,
                "roots": tensor_uids, "cache": self._cache(),
                "lookup": {"before": before, "after": (_counter("CachedCompile"), _counter("UncachedCompile"))
                           if outcome != "compiling" else None},
                "rng": {"before": rng._seed, "after": None}, "execute": None}
        snap["arena"], snap["param_tensor"] = self._arena(cause, set(tensor_uids), graph.params)
        snap["rng"].update(self._seed_chain(graph))
        if snap["donors"] is None:  # a compile about to start: the donors its lookup was given
            owners = [p.owner() for p in graph.params if p.owner is not None]
            snap["donors"] = () if cause != "sync" else buffer_donors(
                graph, [st for st in owners if st is not None and st.data is None])
        snap["params"], snap["overwrites"] = self._params(snap, graph)
        return snap

    @staticmethod
    def _params(snap, graph):
        """Each parameter as the lookup saw it: (index, shape, dtype, tensor id, donated, why);
        and which synced tensor's new buffer is written over which donated parameter."""
        donors = set(snap["donors"] or ())
        rows, owner_of = [], {}
        for i, leaf in enumerate(graph.params):
            st = leaf.owner() if leaf.owner is not None else None
            m = leaf.sig.outs[0]
            tid = snap["param_tensor"].get(i)
            if snap["cause"] != "sync":
                why = "not donated: a value read donates nothing"
            elif st is None:
                why = "not donated: no tensor owns this buffer (a constant, the RNG seed, or a buffer shared with another storage)"
            elif i in donors:
                owner_of[id(st)] = i
                why = ("donated: its tensor is written by this program (its storage's new value is an output of "
                       "this sync), so nothing can read the old buffer after it" if st.data is None else
                       "donated: marked with lazyxla.set_buffer_donation")
            elif not PARAM_ALIASING:
                why = "not donated: XLA_ENABLE_PARAM_ALIASING=0"
            elif auto_sharding():
                why = "not donated: auto-sharding (aliasing would compare unpartitioned shapes)"
            else:
                why = "not donated: this program only reads it, and its tensor keeps this buffer"
            if i < ROW_LIMIT:
                rows.append([i, _shape(m.shape), _dtype(m.dtype), "" if tid is None else tid,
                             "yes" if i in donors else "no", why])
        overwrites = {}
        for uid in snap["roots"]:
            ref = storage.LIVE.get(uid)
            s = ref() if ref is not None else None
            if s is not None and id(s.storage) in owner_of:
                overwrites[uid] = owner_of[id(s.storage)]
        return rows, overwrites

    def _cache(self) -> dict:
        c = computation_cache()
        pc = persistent_cache.get_cache()
        entries = [{"hash": p.key.hex(), "hits": p.hits, "ops": p.graph_size} for p in c.values()]
        return {"capacity": c.capacity, "capacity_env": env_str("XLA_COMPILATION_CACHE_SIZE"),
                "entries": len(c), "recent": entries[-12:][::-1], "evictions": c.evictions,
                "hits": _counter("CachedCompile"), "misses": _counter("UncachedCompile"),
                "persistent": None if pc is None else {"path": pc.path, "readonly": pc.readonly}}

    def _arena(self, cause, roots, leaves):
        """One row per live tensor (id, shape, dtype, state, the line that made it, synced or not
        and why); and, per parameter (``leaves``: the program's), the id of a live tensor holding it."""
        params = {}
        for i, leaf in enumerate(leaves):
            st = leaf.owner() if leaf.owner is not None else None
            if st is not None:
                params.setdefault(id(st), i)
        root_of, rows, holder = {}, [], {}
        live = [(uid, ref()) for uid, ref in list(storage.LIVE.items())]
        live = [(uid, s) for uid, s in live if s is not None]
        for uid, s in live:  # the root tensor of each synced storage
            if uid in roots:
                root_of[id(s.storage)] = uid
        for uid, s in live:
            st = s.storage
            holder.setdefault(id(st), uid)
            pending = st.data is None
            view = s.chain is not None
            state = ("pending IR" if pending else "device data") + (" (a view)" if view else "")
            if cause == "sync":
                if pending:
                    r = root_of.get(id(st))
                    synced = True
                    why = ("synced: its storage's IR is an output of this program" if r == uid
                           else f"synced with tensor {r}, whose storage it shares" if r is not None
                           else "synced")
                else:
                    synced = False
                    why = "not synced: already device data, nothing pending"
            else:
                r = root_of.get(id(st))
                if uid in roots:
                    synced, why = True, "read: computed by this program; it keeps its pending IR (a read replaces nothing)"
                elif pending and r is not None:
                    synced, why = True, f"read through tensor {r}, whose storage it shares"
                elif pending:
                    synced, why = False, "not synced: pending, but not read (a value read computes only what it reads)"
                else:
                    synced, why = False, "not synced: already device data"
            i = params.get(id(st))
            if i is not None and not pending:
                why += f"; its buffer is parameter {i} of this program"
            site = self.born.get(uid)
            made = resolve_site(site) if site else None
            if made is None and pending:
                made = st.ir[0].where
            rows.append({"id": uid, "shape": _shape(s.meta.shape), "dtype": _dtype(s.meta.dtype), "state": state,
                         "made": _where(made), "synced": synced, "why": why})
        param_tensor = {i: holder.get(sid) for sid, i in params.items()}
        return rows, param_tensor

    @staticmethod
    def _seed_chain(graph) -> dict:
        nodes = [n for n in graph.post if n.data is None and n.sig.op == SEED_OP]
        if not nodes:
            return {"chain": 0, "leaf_param": None, "leaf_value": None}
        leaf = None
        for n in nodes:
            o = n.operands[0][0]
            if o.data is not None:
                leaf = o
                break
        idx = next((i for i, p in enumerate(graph.params) if p is leaf), None)
        value = None
        if leaf is not None:
            try:
                d = leaf.data
                value = int(np.asarray(d.get() if type(d) is Placeholder else d))
            except Exception:  # noqa: BLE001 - a buffer gone: the value is not shown
                value = None
        return {"chain": len(nodes), "leaf_param": idx, "leaf_value": value}

    @staticmethod
    def _buffer(o) -> dict:
        a = o.array if type(o) is Placeholder else o
        try:
            devs = sorted(a.devices(), key=lambda d: d.id)
            where = str(devs[0]) if len(devs) == 1 else f"{len(devs)} devices, {a.sharding}"
            return {"shape": _shape(a.shape), "dtype": str(a.dtype), "bytes": int(a.nbytes), "device": where}
        except Exception as e:  # noqa: BLE001
            return {"shape": "?", "dtype": "?", "bytes": 0, "device": f"({type(e).__name__})"}

    # -- the page's data --------------------------------------------------------------------
    def export(self, error=None) -> dict:
        """Plain data for ``walk_page``: the run's lookups, which one is walked and why, and each
        stage's source and values. ``error``: the script's exception, if it raised."""
        snap = self.kept
        data = {"lookups": self.rows, "steps": self.steps, "pick": None if self.pick is None else str(self.pick),
                "walked": None if snap is None else snap["n"], "sites": list(SITES), "stages": []}
        if snap is None:
            data["note"] = self._nothing_walked()
            snap = self._end if self._end is not None else self._end_state()
        for stage in STAGES:
            src = stage_source(stage)
            body = getattr(self, "_stage_" + stage.name)(snap, error)
            data["stages"].append({"name": stage.name, "title": stage.title, "what": stage.what, "source": src,
                                   **body})
        return data

    def _nothing_walked(self) -> str:
        if not self.rows:
            return ("This run synced nothing: no program was looked up, compiled or run (no lazyxla.sync(), "
                    "no value read). The stages below show the state at the end of the run.")
        if self.pick is not None:
            return (f"No lookup of this run matches --sync {self.pick}: it had {len(self.rows)} lookups "
                    f"(listed above). The stages below show the state at the end of the run.")
        return "Nothing to walk."

    def _end_state(self) -> dict:
        rows, _ = self._arena("none", set(), ())
        return {"n": None, "cause": "none", "hash": None, "outcome": None, "ops": 0, "where": None, "trace": None,
                "graph": None, "prog": None, "donors": None, "roots": [], "cache": self._cache(), "lookup": None,
                "rng": {"before": rng._seed, "after": None, "chain": 0, "leaf_param": None, "leaf_value": None,
                        "pending": rng.pending()},
                "execute": None, "arena": rows, "param_tensor": {}}

    # Each stage: {"facts": [[label, value]], "tables": [{caption, columns, rows}], "text": [..],
    # "code": {caption, text} or None, "status": "ok" | "failed" | "none"}.
    @staticmethod
    def _stage_cache(snap, error):
        c = snap["cache"]
        pc = c["persistent"]
        facts = [["XLA_COMPILATION_CACHE_SIZE", f"{c['capacity']}" + (" (set)" if c["capacity_env"] else " (default)")],
                 ["entries", f"{c['entries']} of {c['capacity']}"],
                 ["hits so far (CachedCompile)", c["hits"]], ["misses so far (UncachedCompile)", c["misses"]],
                 ["evictions so far", c["evictions"]],
                 ["XLA_PERSISTENT_CACHE_PATH", pc["path"] if pc else "(unset: no persistent cache)"],
                 ["XLA_PERSISTENT_CACHE_READ_ONLY", ("true: loads only" if pc["readonly"] else "false: loads and stores")
                  if pc else "(no persistent cache)"]]
        rows = [[e["hash"][:16], e["ops"], e["hits"]] for e in c["recent"]]
        text = []
        if snap["n"] is not None:
            text.append(f"The cache as this lookup left it (lookup {snap['n']}). Entries are listed most recently "
                        "used first; the least recently used one goes when a new program overflows the capacity.")
        return {"facts": facts, "tables": [{"caption": "entries, most recently used first",
                                            "columns": ["graph hash", "ops", "hits"], "rows": rows}],
                "text": text, "status": "ok"}

    @staticmethod
    def _stage_arena(snap, error):
        rows = snap["arena"]
        synced = sum(1 for r in rows if r["synced"])
        if snap["cause"] == "none":
            text = [f"{len(rows)} live tensors at the end of the run, "
                    f"{sum(1 for r in rows if r['state'].startswith('pending'))} still pending IR."]
        else:
            what = "this sync" if snap["cause"] == "sync" else "this value read"
            text = [f"{len(rows)} live tensors when {what} ran; {synced} taken into its program, "
                    f"{len(snap['roots'])} of them as roots (one per storage)."]
        table = {"caption": "live tensors, in the order they were made", "columns":
                 ["id", "shape", "dtype", "state", "made at", "synced", "why"],
                 "rows": [[r["id"], r["shape"], r["dtype"], r["state"], r["made"] or "", "yes" if r["synced"] else "no",
                           r["why"]] for r in rows[:ROW_LIMIT]]}
        if len(rows) > ROW_LIMIT:
            text.append(f"The first {ROW_LIMIT} of {len(rows)} are listed.")
        return {"facts": [["live tensors", len(rows)], ["synced", synced]], "tables": [table], "text": text,
                "status": "ok"}

    @staticmethod
    def _stage_rng(snap, error):
        r = snap["rng"]
        before = r["before"]
        facts = [["host seed before", before]]
        text = []
        if snap["cause"] == "sync":
            after = r["after"]
            facts.append(["host seed after", after if after is not None else "(the step did not end here)"])
            if after is not None:
                text.append(f"The sync ended the step: seed' = 1012031 + {before} * 7012063 mod 2^64 = {after}.")
        elif snap["cause"] == "read":
            facts.append(["host seed after", f"{before} (unchanged: a value read does not end the step)"])
        facts.append(["random ops in this graph", r["chain"]])
        table = None
        if r["chain"]:
            s = r["leaf_value"] if r["leaf_value"] is not None else _as_int64(before)
            vals = []
            for k in range(min(r["chain"], 8)):
                s = _as_int64(2531011 + 214013 * s)
                vals.append([k + 1, s])
            text.append(f"The seed is parameter {r['leaf_param']} of the program (a device-data scalar, "
                        f"value {r['leaf_value'] if r['leaf_value'] is not None else '?'}); the graph chains "
                        f"{r['chain']} seed_next nodes from it, one per random op. Their values, as the program "
                        f"computes them:")
            table = {"caption": "the seed chain (int64)", "columns": ["random op", "seed"], "rows": vals}
        else:
            text.append("No random op was recorded in this graph: the seed is not one of its parameters.")
        return {"facts": facts, "tables": [table] if table else [], "text": text, "status": "ok"}

    @staticmethod
    def _stage_hash(snap, error):
        tr = snap["trace"]
        if tr is None:
            return {"facts": [], "tables": [], "text": ["No key was folded: nothing was synced."], "status": "none"}
        steps = [s.as_dict() for s in tr.steps]
        rows = [[i, s["site"], s["summary"], s["ingredient"], s["digest"]] for i, s in enumerate(steps)]
        text = [f"{len(steps)} merges; the last digest is the key, {tr.hex}."]
        if not any(s["site"] == "donation" for s in steps):
            text.append("No donation merge: the donated list was empty, and an empty list is not merged.")
        return {"facts": [["graph hash", tr.hex], ["merges", len(steps)]],
                "tables": [{"caption": "the fold, in R3's order", "columns": ["#", "site", "ingredient", "hash",
                                                                             "digest after"], "rows": rows,
                            "kind": "fold"}],
                "text": text, "status": "ok", "steps": steps}

    def _stage_lookup(self, snap, error):
        if snap["trace"] is None:
            return {"facts": [], "tables": [], "text": ["No lookup."], "status": "none"}
        lk = snap["lookup"]
        b = lk["before"]
        outcome = snap["outcome"]
        said = {"hit": "hit: the program was in the in-memory cache (CachedCompile)",
                "persistent": "hit in the persistent cache: loaded from disk, not compiled (CachedCompile)",
                "compile": "miss: compiled now (UncachedCompile)",
                "failed": "miss: the compile raised (see below)", "compiling": "miss: compiling"}[outcome]
        facts = [["outcome", said], ["CachedCompile before", b[0]], ["UncachedCompile before", b[1]]]
        if lk["after"] is not None:
            facts += [["CachedCompile after", lk["after"][0]], ["UncachedCompile after", lk["after"][1]]]
        text = []
        status = "ok"
        if outcome == "compile":
            rec = [r for r in explain.recompile_log() if r.hash == snap["hash"]]
            if rec:
                text.append(str(rec[-1]))
        elif outcome in ("hit", "persistent"):
            first = next((r for r in self.rows if r["hash"] == snap["hash"] and r["outcome"] == "compile"), None)
            if first is not None:
                text.append(f"Compiled at lookup {first['n']} of this run ({first['cause']} at {first['where']}).")
            elif outcome == "hit":
                text.append("Compiled before the walk began recording.")
        if outcome == "failed":
            status = "failed"
            text.append("The compile raised; the script stopped with: " + (error or "(no error reached the walk)"))
        return {"facts": facts, "tables": [], "text": text, "status": status}

    @staticmethod
    def _stage_donation(snap, error):
        g = snap["graph"]
        if g is None:
            return {"facts": [], "tables": [], "text": ["Nothing was run, so nothing was donated."] + _COUNTER,
                    "status": "none"}
        donors = set(snap["donors"] or ())
        facts = [["XLA_ENABLE_PARAM_ALIASING", "true" if PARAM_ALIASING else "false (donation off)"],
                 ["auto-sharding", "on (donation off)" if auto_sharding() else "off"],
                 ["donated parameters", len(donors)]]
        rows = snap["params"]
        text = []
        if snap["cause"] == "read":
            text.append("A value read runs with force_ltc_data false and donates nothing: it leaves every tensor's "
                        "pending IR in place, so the same IR may be run again, and its inputs must still be there.")
        text += _COUNTER
        return {"facts": facts, "tables": [{"caption": "the program's parameters", "columns":
                                            ["parameter", "shape", "dtype", "tensor", "donated", "why"],
                                            "rows": rows}], "text": text, "status": "ok",
                "counterexample": _counterexample()}

    @staticmethod
    def _stage_lowering(snap, error):
        g = snap["graph"]
        if g is None:
            return {"facts": [], "tables": [], "text": ["Nothing was lowered."], "status": "none"}
        n = len(g.params)
        wrapped = n >= WRAP_THRESHOLD and not auto_sharding()
        ops = collections.Counter(nd.sig.op for nd in g.post if nd.data is None)
        shard_rows = []
        for nd in g.post:
            if nd.data is None and nd.sig.op == SHARDING_OP:
                text = dict(nd.sig.template[1]).get("sharding") if nd.sig.template else None
                shard_rows.append(["annotation", _shape(nd.sig.outs[0].shape), text or "", _where(nd.where) or ""])
            elif nd.data is not None and nd.sig.template:
                text = dict(nd.sig.template[1]).get("sharding")
                if text:
                    shard_rows.append(["device data", _shape(nd.sig.outs[0].shape), text, ""])
        facts = [["op nodes", g.n_ops], ["parameters", n],
                 ["XLA_PARAMETER_WRAPPING_THREADSHOLD", WRAP_THRESHOLD],
                 ["parameter wrapping", f"yes: {n} >= {WRAP_THRESHOLD}, passed as one tuple" if wrapped
                  else f"no: {n} < {WRAP_THRESHOLD}, passed one by one"],
                 ["sharding annotations", len(shard_rows) or "none"]]
        prog = snap["prog"]
        if prog is not None:
            ops_checked = collections.Counter(c[0] for c in prog.checks)
            facts.append(["value checks (LAZYXLA_CHECK_VALUES)",
                          ", ".join(f"{op} x{n}" for op, n in ops_checked.items()) + " (one more output)"
                          if prog.checks else "none"])
        try:
            program = hlo_text(g)
        except Exception as e:  # noqa: BLE001 - a graph that cannot lower: say why
            program = f"(the program could not be lowered: {type(e).__name__}: {e})"
        tables = [{"caption": "ops in the graph", "columns": ["op", "count"], "rows": [[k, v] for k, v in
                                                                                     ops.most_common(30)]}]
        if shard_rows:
            tables.append({"caption": "sharding", "columns": ["kind", "shape", "sharding", "at"], "rows": shard_rows})
        return {"facts": facts, "tables": tables, "text": [], "status": "ok",
                "code": {"caption": f"the program text ({program.count(chr(10)) + 1} lines)", "text": program}}

    @staticmethod
    def _stage_execute(snap, error):
        prog = snap["prog"]
        if snap["outcome"] == "failed":
            return {"facts": [], "tables": [], "text": ["Nothing ran: the compile raised."], "status": "failed"}
        if prog is None:
            return {"facts": [], "tables": [], "text": ["Nothing ran."], "status": "none"}
        ex = snap["execute"] or {}
        facts = [["compile time", f"{prog.compile_ns / 1e6:.1f} ms" + ("" if snap["outcome"] == "compile" else
                                                                       " (when it was compiled; nothing now)")
                  if prog.compile_ns else "0 (loaded, not compiled)"],
                 ["execute time (ExecuteTime)", f"{ex['ns'] / 1e6:.3f} ms" if ex.get("ns") is not None else "?"]]
        status, text = "ok", []
        if ex.get("error"):
            status = "failed"
            text.append("The program failed while running: " + ex["error"])
        rows = []
        for k, b in enumerate(ex.get("outputs") or []):
            uid = snap["roots"][k] if k < len(snap["roots"]) else None
            if snap["cause"] == "read":
                to = f"read by the host; tensor {uid} keeps its pending IR"
            else:
                to = f"tensor {uid}'s storage, now device data"
                j = snap["overwrites"].get(uid)
                if j is not None:
                    to += f" (written over parameter {j}'s donated buffer)"
            rows.append([k, b["shape"], b["dtype"], b["bytes"], b["device"], to])
        return {"facts": facts, "tables": [{"caption": "the buffers that came back", "columns":
                                            ["output", "shape", "dtype", "bytes", "device", "went to"],
                                            "rows": rows}], "text": text, "status": status}


_COUNTER = ["Why only then, by the seed's counterexample: take a tensor A, a graph that adds 0.4 to it, and two "
            "prints. If the first print donated A's buffer, the program would write A + 0.4 over it; the second "
            "print runs the same graph on that buffer and shows A + 0.8."]


def _counterexample() -> dict:
    """The counterexample with numbers, computed in float32 as the program computes them."""
    import torch
    a = torch.tensor([1.0, 2.5], dtype=torch.float32)
    first = a + 0.4
    donated_second = first + 0.4
    return {"A": a.tolist(), "first read": first.tolist(), "second read, A kept": first.tolist(),
            "second read, A donated": donated_second.tolist()}
