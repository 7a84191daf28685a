"""Why did it recompile: each uncached compile compared with the closest earlier key.

Every compiled key's fold trace is kept (with IR skeletons, no buffers). When a new key
compiles, it is scored against *all* earlier ones (a difference in any merge site counts
one, each differing tensor root one more), the closest wins (the latest on a tie), and the
first merge site that differs from it, in R3's order, names the cause. For a tensor
difference, both IRs are walked from the root down to the deepest first node that
differs, and the record names its op, its old and new shape, dtype or constant, and the
user's line that recorded it.

A torch.compile region that Dynamo hands over again (a guard failed: a new batch size, a
new dtype) is a record of its own, site ``"dynamo"``, with Dynamo's guard failures as its text;
a step of ``lazyxla.compile(fn, replay=True)`` captured again (new arguments, a stale binding)
is one of site ``"replay"``, with the reason.

A compile whose graph has repeated layers says what rolled into loops or why not
(``rolling.last_report``, the compile's own: rolling runs just before it).

``recompile_log()`` returns the records; ``LAZYXLA_EXPLAIN_RECOMPILES=1`` prints each one
as it happens. ``Recorder`` is the subscriber (``events``) that keeps the history; it reads
the persistent cache's list of keys other processes compiled. May touch: its own history.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

from ..compiler import persistent_cache
from .. import rolling
from ..config import env_flag
from ..dynamic import describe
from ..keys.graph_hash import SITES, FoldTrace, Step
from ..ir.user_line import fmt_where
from ..ir.node import post_order, skeleton

EXPLAIN = env_flag("LAZYXLA_EXPLAIN_RECOMPILES", False)


@dataclass
class RecompileRecord:
    index: int                 # 1 for the first uncached compile of the process
    site: str | None           # first merge site that differs from the closest key; None: no earlier key
    text: str                  # what changed, in words a user can act on
    hash: str                  # the new key
    closest: str | None        # the closest earlier key
    compile_ns: int            # what the compile cost
    cause: str                 # "sync", "read" or "capture"; "dynamo": a torch.compile region traced
    #                            again; "replay": a step of lazyxla.compile(replay=True) captured again
    where: tuple | None = None  # the user's line behind the first difference, if known
    trace: object = field(default=None, repr=False)
    sites: tuple = ()          # every merge site that differs from the closest key, in R3's order

    @property
    def compile_ms(self) -> float:
        return self.compile_ns / 1e6

    def __str__(self):
        head = f"lazyxla recompile #{self.index} ({self.cause}, {self.compile_ms:.1f} ms): key {self.hash[:16]}"
        if self.site is None or self.closest is None:
            return head + ": " + self.text
        changed = ", ".join(self.sites or (self.site,))
        return f"{head}: {changed} changed since key {self.closest[:16]}: {self.text}"


_HISTORY: list = []   # fold traces of every compiled key, oldest first
_LOG: list = []
_USES: dict = {}      # key hex -> [lookups, compile ns, cause of the compile]
_NOTES: list = []     # dynamic-shape decisions since the last compile (``dynamic.describe``)


def recompile_log() -> list:
    """One RecompileRecord per uncached compile, in order."""
    return list(_LOG)


def clear():
    _NOTES.clear()
    _HISTORY.clear()
    _LOG.clear()
    _USES.clear()
    _SIZES.clear()


def mark() -> tuple:
    """Where the history stands now: ``export(since=mark())`` later holds only what came after."""
    return len(_HISTORY), len(_LOG)


def export(since=(0, 0)) -> dict:
    """Everything the fold page shows, as plain JSON-able data: every compiled key with its
    uses, compile cost and fold (each merge: site, summary, ingredient, digest; a tensor
    merge also carries its IR as a node list with the user's lines), and the records. With
    ``since`` (a ``mark()``): the keys and records after it, and the earlier keys those records
    were compared with (``lazyxla explain`` called in a process that compiled before it)."""
    log = _LOG[since[1]:]
    closest = {r.closest for r in log if r.closest}
    keys = []
    for tr in [t for t in _HISTORY[:since[0]] if t.hex in closest] + _HISTORY[since[0]:]:
        uses, ns, cause = _USES.get(tr.hex, [0, 0, ""])
        steps = []
        for st in tr.steps:
            d = st.as_dict()
            if st.site == "tensors" and st.detail is not None:
                d["ir"] = _ir_table(st.detail[1])
            steps.append(d)
        keys.append({"hash": tr.hex, "uses": uses, "compile_ms": ns / 1e6, "cause": cause, "steps": steps})
    recs = [{"index": r.index, "site": r.site, "sites": list(r.sites), "text": r.text, "hash": r.hash, "closest": r.closest,
             "compile_ms": r.compile_ms, "where": list(r.where) if r.where else None} for r in log]
    return {"keys": keys, "records": recs, "sites": list(SITES)}


def _ir_table(value):
    """The IR below a root as a list, operands first: {id, op, outs, where, operands, hash}."""
    root, idx = value
    order, index = [], {}
    for n in post_order([value]):
        index[id(n)] = len(order)
        order.append({"id": len(order), "op": n.op, "outs": [repr(m) for m in n.outs],
                      "where": fmt_where(n.where) if n.where else None, "hash": n.hash.hex(),
                      "params": None if n.is_data else _params_text(n.params),
                      "operands": [index[id(o)] for o, _ in n.operands]})
    return {"nodes": order, "root": index[id(root)], "output": idx}


# ---------------------------------------------------------------------------------------
def distance(a, b) -> float:
    """How far two fold traces are: one per differing site besides the tensors; for the
    tensors, the number of IR nodes that differ in themselves under each pair of roots (see
    _tree_distance), and for a root that only one of them has, the size of its IR. So a
    key of one small root is far from a key of sixty. Ties go to the latest key."""
    return _score(a.by_site(), b.by_site(), _root_distance)


def _score(da, db, per_root) -> int:
    """``distance`` of two traces' steps by site, each pair of unequal roots scored by ``per_root``."""
    n = 0
    for site in SITES:
        if site == "tensors":
            ta, tb = da[site], db[site]
            n += sum(per_root(x, y) for x, y in zip(ta, tb) if x.ingredient != y.ingredient)
            n += sum(_root_size(x) for x in (ta[len(tb):] if len(ta) > len(tb) else tb[len(ta):]))
        elif [s.ingredient for s in da[site]] != [s.ingredient for s in db[site]]:
            n += 1
    return n


_BUDGET = 400  # nodes looked at per root: an estimate is enough to rank candidates


def _root_distance(sa, sb) -> float:
    """How many IR nodes differ in themselves between two roots (see _tree_distance); 0 for
    equal roots. Keys from other processes carry no IR: 2 when unequal."""
    if sa.ingredient == sb.ingredient:
        return 0
    try:
        (ra, _), (rb, _) = sa.detail[1], sb.detail[1]
    except (TypeError, AttributeError, IndexError):
        return 2
    return _tree_distance(ra, rb, {}, [_BUDGET])


def _root_bound(sa, sb) -> int:
    """At most ``_root_distance(sa, sb)``, from the two roots alone: roots of unequal hashes
    differ in at least one node (``_tree_distance`` finds one, or gives 1 past its budget)."""
    try:
        (ra, _), (rb, _) = sa.detail[1], sb.detail[1]
    except (TypeError, AttributeError, IndexError):
        return 2
    return int(ra.hash != rb.hash)


_SIZES: dict = {}  # id(step) -> (step, its root's size): a kept key's roots are sized once


def _root_size(step) -> int:
    """How many IR nodes a root has (up to the budget); 2 for a key from another process."""
    hit = _SIZES.get(id(step))
    if hit is not None and hit[0] is step:
        return hit[1]
    try:
        root, _ = step.detail[1]
    except (TypeError, AttributeError, IndexError):
        return 2
    seen, stack = set(), [root]
    while stack and len(seen) < _BUDGET:
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            stack.extend(o for o, _ in node.operands)
    _SIZES[id(step)] = (step, len(seen))
    return len(seen)


def _tree_distance(a, b, memo, budget) -> int:
    """Count the nodes that differ in themselves: another op, another constant with the same
    outputs, or another output while every operand is the same. A shape change at an input
    counts once, not once for every node it flows through."""
    if a.hash == b.hash:
        return 0
    k = (id(a), id(b))
    if k in memo:
        return memo[k]
    budget[0] -= 1
    if budget[0] < 0:  # large graphs: an estimate is enough to rank candidates
        return 1
    if len(a.operands) != len(b.operands):
        d = 1 + max(len(a.operands), len(b.operands))
    else:
        below = [_tree_distance(x, y, memo, budget) for (x, _), (y, _) in zip(a.operands, b.operands)]
        # sizes in a view's or expand's parameters follow its shapes: only a changed constant
        # with unchanged outputs counts as a difference of the node itself
        itself = a.op != b.op or (a.params != b.params and a.outs == b.outs) or \
            (a.outs != b.outs and not any(below))
        d = int(itself) + sum(below)
    memo[k] = d
    return d


def differing_sites(a, b) -> list:
    """Every merge site whose ingredients differ between two traces, in R3's order."""
    da, db = a.by_site(), b.by_site()
    return [site for site in SITES if [s.ingredient for s in da[site]] != [s.ingredient for s in db[site]]]


def closest(trace, candidates):
    """The candidate nearest ``trace`` by ``distance``, the latest on a tie. Each candidate's
    distance is first bounded from below by its roots alone (``_root_bound``: no IR walked);
    candidates are tried from the lowest bound, the latest first among equals, and the search
    ends at a bound above the best distance found: the answer of trying them all, at the cost
    of a few. (Trying them all walked IR trees of every earlier key at every compile: a
    process's compiles grew slower with its history, a 2-layer GPT-2's three steps from 7 s to
    37 s after a few hundred tests' keys.)"""
    dn = trace.by_site()
    olds = [c.by_site() for c in candidates]
    order = sorted((_score(dn, do, _root_bound), -k) for k, do in enumerate(olds))
    best, best_d = None, None
    for bound, k in order:
        if best_d is not None and bound > best_d:
            break
        d = _score(dn, olds[-k], _root_distance)
        if best_d is None or d < best_d or (d == best_d and -k > best):
            best, best_d = -k, d
    return candidates[best]


# ---------------------------------------------------------------------------------------
def explain(new, old):
    """(sites, text, where) for a new trace against an old one: every differing merge site in
    R3's order, and what changed at each. Sameness is claimed only of what was compared."""
    sites = differing_sites(new, old)
    if not sites:
        return (), "identical key", None
    dn, do = new.by_site(), old.by_site()
    alone = len(sites) == 1
    parts, where = [], None
    for site in sites:
        text, w = _site_text(site, dn, do, alone)
        parts.append(text if alone else f"[{site}] {text}")
        where = where or w
    return tuple(sites), " ".join(parts), where


def _site_text(site, dn, do, alone):
    """(what changed at one site, the user's line or None); ``alone``: no other site differs."""
    if site == "force_ltc_data":
        read = "false" in dn[site][0].summary
        if alone and read:
            return ("the same operations were compiled for a sync before; this is a value read (print, .item(), "
                    ".cpu() of a pending tensor), which has force_ltc_data=false and so its own program. "
                    "Read values after lazyxla.sync() to reuse the sync's program."), None
        if alone:
            return ("the same operations were compiled for a value read before (force_ltc_data=false); a sync "
                    "(force_ltc_data=true) compiles its own program. Read values after lazyxla.sync() instead."), None
        if read:
            return "this is a value read (force_ltc_data=false); the closest earlier key is a sync's.", None
        return "this is a sync (force_ltc_data=true); the closest earlier key is a value read's.", None
    if site == "environment":
        return (f"the compilation environment or build revisions changed: now {dn[site][0].summary}; "
                f"before {do[site][0].summary}"), None
    if site == "tensors":
        return _explain_tensors(dn["tensors"], do["tensors"])
    if site == "parameters":
        head = "the same operations, but their inputs are bound differently" if alone else \
            "the inputs are bound differently"
        return (f"{head}: {dn[site][0].summary}, before {do[site][0].summary[len('parameter sequence '):]}."
                + (" An input used twice, or inputs passed in another order, changes the program." if alone else "")
                ), None
    if site == "donation":
        now = dn[site][0].summary if dn[site] else "no donated parameters"
        before = do[site][0].summary if do[site] else "no donated parameters"
        head = "the same graph, but other input buffers are donated" if alone else "other input buffers are donated"
        return (f"{head}: {now}, before {before}." + (
            " In-place updates of inputs (weights, optimizer state) make their buffers donatable at a sync."
            if alone else "")), None
    return f"the auto-sharding setting changed: {dn[site][0].summary}, before {do[site][0].summary}", None


def _explain_tensors(new_steps, old_steps):
    text, where = _first_tensor_difference(new_steps, old_steps)
    if len(new_steps) != len(old_steps) and min(len(new_steps), len(old_steps)) and \
            any(a.ingredient != b.ingredient for a, b in zip(new_steps, old_steps)):
        text += f" There are {len(new_steps)} pending tensors, before {len(old_steps)}."
    return text, where


def _first_tensor_difference(new_steps, old_steps):
    for i, (a, b) in enumerate(zip(new_steps, old_steps)):
        if a.ingredient != b.ingredient and (a.detail is None or b.detail is None):
            return f"pending tensor #{i + 1} changed: {a.summary}, before {b.summary}.", None
        if a.ingredient != b.ingredient:
            uid, (ra, ia) = a.detail
            _, (rb, ib) = b.detail
            node_a, node_b, user, loop = _first_difference(ra, rb)
            what = _describe_difference(node_a, node_b)
            if loop is not None:
                what = f"inside the loop body of {loop.op}" + \
                    (f" (recorded at {fmt_where(loop.where)})" if loop.where else "") + f": {what}"
            w = user.where if user is not None else None
            loc = f" at {fmt_where(w)}" if w else ""
            root = f"pending tensor #{i + 1} ({ra.op} -> {ra.outs[ia]!r}"
            root += f", recorded at {fmt_where(ra.where)})" if ra.where else ")"
            text = f"{root}: first difference{loc}: {what}."
            hint = _hint(node_a, node_b)
            return (text + (" " + hint if hint else "")), w
    if len(new_steps) > len(old_steps):
        extra = new_steps[len(old_steps)]
        if extra.detail is None:
            return f"a pending tensor more than before: {extra.summary}.", None
        uid, (r, i) = extra.detail
        w = r.where
        return (f"there are {len(new_steps)} pending tensors, before {len(old_steps)}: the new one is "
                f"{r.op} -> {r.outs[i]!r}" + (f" recorded at {fmt_where(w)}" if w else "") +
                ". A tensor still alive at the sync (e.g. kept for a debug print) becomes an output of the "
                "program."), w
    missing = old_steps[len(new_steps)]
    if missing.detail is None:
        return f"a pending tensor less than before: {missing.summary} is gone.", None
    _, (r, i) = missing.detail
    return (f"there are {len(new_steps)} pending tensors, before {len(old_steps)}: {r.op} -> {r.outs[i]!r}"
            + (f" (recorded at {fmt_where(r.where)})" if r.where else "") + " is no longer pending."), r.where


def _first_difference(a, b):
    """Walk two differing IRs from the root down to the deepest first node that differs,
    following operands while the nodes are the same op, and into a loop's body when two loops
    differ only there; also return the nearest node on the way that knows the user's line and
    the innermost loop entered (or None)."""
    user = a if a.where else None
    loop = None
    while True:
        if a.op != b.op or len(a.operands) != len(b.operands):
            return a, b, user, loop
        nxt = _first_differing_operand(a, b)
        if nxt is None:  # the node itself differs (its output, its parameters or its loop body)
            nxt = _first_differing_body_root(a, b)
            if nxt is None:
                return a, b, user, loop
            loop = a
        a, b = nxt
        if a.where:
            user = a


def _body_roots(n):
    """The roots of a loop node's traced body (``lazyxla::scan``'s first parameter), or None."""
    if n.is_data or not n.params or not n.params[0]:
        return None
    return getattr(n.params[0][0], "roots", None)


def _first_differing_body_root(a, b):
    ra, rb = _body_roots(a), _body_roots(b)
    if not ra or not rb or len(ra) != len(rb) or a.outs != b.outs:
        return None
    pair = next(((x, y) for x, y in zip(ra, rb) if x[0].hash != y[0].hash), None)
    return None if pair is None else (skeleton(pair[0])[0], skeleton(pair[1])[0])


def _first_differing_operand(a, b):
    for (oa, _), (ob, _) in zip(a.operands, b.operands):
        if oa.hash != ob.hash:
            return oa, ob
    return None


def _describe_difference(a, b):
    if a.is_data and b.is_data:
        if a.layout != b.layout and a.outs == b.outs:
            return (f"input device data {a.outs[0]!r} is sharded {a.layout or 'on one device'}, before "
                    f"{b.layout or 'on one device'} (its sharding changed)")
        return f"input device data {a.outs[0]!r}, before {b.outs[0]!r}"
    if a.op != b.op:
        return f"{a.op} -> {list(a.outs)}, before {b.op} -> {list(b.outs)}"
    if a.outs != b.outs:
        old = ", ".join(repr(m) for m in b.outs)
        new = ", ".join(repr(m) for m in a.outs)
        return f"{a.op} gives {new}, before {old}"
    if a.params != b.params:
        return f"{a.op} with {_params_text(a.params)}, before {_params_text(b.params)}"
    return f"{a.op}: its inputs differ"


def _params_text(template):
    args, kwargs = template
    parts = [repr(x) for x in args] + [f"{k}={v!r}" for k, v in kwargs]
    return "(" + ", ".join(parts) + ")"


def _hint(a, b):
    if a.op == b.op and a.outs != b.outs:
        sa, sb = [m.shape for m in a.outs], [m.shape for m in b.outs]
        if sa != sb:
            return ("A size that changes between steps (batch size, sequence length) compiles a new program "
                    "per shape until lazyxla pads it to a bound (from a structure's second size on, when every "
                    "changed size follows one input dimension and every op on it has a padding rule).")
        return "A dtype change compiles a new program."
    if not a.is_data and a.op == b.op and a.params != b.params:
        return "A Python constant that changes between steps is part of the graph; pass it as a tensor."
    return ""


# ---------------------------------------------------------------------------------------
# A graph that holds nearly all of a recent key's operations and more: nothing was synced in
# between, so the pending IR grew (a loop that reads a value every iteration and never syncs).
_GROWN_LOOKBACK = 3      # recent keys looked at
_GROWN_SHARE = 0.9       # of the earlier key's operations found in the new graph
_GROWN_BUDGET = 20000    # nodes walked per graph


def _op_hashes(trace, roots=True) -> set:
    """The hashes of the op nodes (not device data) under a trace's tensor merges; without the
    roots themselves when ``roots`` is false (what a later graph built on these values holds)."""
    seen, hashes, stack, tops = set(), set(), [], set()
    for st in trace.steps:
        if st.site == "tensors" and st.detail is not None and hasattr(st.detail[1][0], "operands"):
            stack.append(st.detail[1][0])
            tops.add(id(st.detail[1][0]))
    while stack and len(seen) < _GROWN_BUDGET:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if not n.is_data and (roots or id(n) not in tops):
            hashes.add(n.hash)
        stack.extend(o for o, _ in n.operands)
    return hashes


def _grown(trace, recent):
    """(the key, a sentence) when a value read's graph holds nearly all operations of one of the
    ``recent`` value reads (the latest first; its roots aside: a read's own last op) and more;
    else (None, ""). (A sync's graph holds a read's before it by design: reads keep the IR.)"""
    new = _op_hashes(trace)
    for old in reversed(recent):
        if old.key == trace.key or old.force_ltc_data:
            continue
        ops = _op_hashes(old, roots=False)
        held = len(ops & new)
        if ops and len(new) > len(ops) and held >= _GROWN_SHARE * len(ops):
            return old, (f"The graph grew: it holds {held} of the {len(ops)} operations below key {old.hex[:16]}'s "
                         f"roots and {len(new) - held} more, so nothing was synced since and they are computed "
                         f"again, in a larger program. A loop that reads a value every iteration and never syncs "
                         f"(HuggingFace's generate is one) compiles a larger program every iteration: call "
                         f"lazyxla.sync() once per iteration (for generate: custom_generate=lazyxla.hf.generate).")
    return None, ""


_DISK: list | None = None  # fold traces of programs other processes stored in the persistent cache


def _disk_history():
    """Keys compiled by other processes sharing the persistent cache (their folds, no IR)."""
    global _DISK
    if _DISK is None:
        _DISK = []
        pc = persistent_cache.get_cache()
        for e in (pc.entries() if pc is not None else []):
            fold = e.get("fold")
            if not fold:
                continue
            try:
                steps = [Step(d["site"], d["summary"], bytes.fromhex(d["ingredient"]), bytes.fromhex(d["digest"]))
                         for d in fold]
            except (KeyError, TypeError, ValueError):
                continue
            _DISK.append(FoldTrace(steps))
    return _DISK


class Recorder:
    """The subscriber that keeps every compiled key and explains each compile, and notes each
    torch.compile region traced (a Dynamo recompile says which guard failed)."""

    def after_capture(self, region, why, key_hex, where, n_ops):
        if why == "first trace":
            return  # nothing was compiled before it: not a recompile
        rec = RecompileRecord(len(_LOG) + 1, "dynamo", f"torch.compile region {region} traced again ({n_ops} "
                              f"ops): {why}", key_hex, None, 0, "dynamo", where)
        _LOG.append(rec)
        if EXPLAIN:
            print(str(rec), file=sys.stderr)

    def after_graph_capture(self, step, why, key_hex, where):
        if why == "first capture":
            return
        rec = RecompileRecord(len(_LOG) + 1, "replay", f"lazyxla.compile({step}, replay=True) captured its step "
                              f"again: {why}", key_hex, None, 0, "replay", where)
        _LOG.append(rec)
        if EXPLAIN:
            print(str(rec), file=sys.stderr)

    def dynamic(self, kind, *info):
        if kind != "rent":  # a size run in a larger bound's program compiles nothing: not a recompile's note
            _NOTES.append(describe(kind, *info))  # said with the compile it comes with

    def before_compile(self, cause, trace, graph):
        _disk_history()  # read other processes' keys before this one is stored

    def after_lookup(self, cause, lookup_trace, prog, graph, compiled):
        use = _USES.get(prog.key.hex())
        if use is None:
            use = _USES[prog.key.hex()] = [0, prog.compile_ns, cause]
        use[0] += 1
        if not compiled:
            return
        trace = prog.trace
        exact = prog.extra.get("padded_for")
        if exact is not None:  # a padded program: what changed is the exact graph's key; said with its bound
            self._record(exact, cause, prog, f" (padded: {prog.extra['dynamic']}; program {trace.hex[:16]})")
            return
        self._record(trace, cause, prog, "")

    def _record(self, trace, cause, prog, padded):
        if _NOTES:
            padded += " [dynamic shapes] " + "; ".join(_NOTES)
            _NOTES.clear()
        if rolling.last_report:  # this compile's repeated layers: what rolled into loops, or why not
            padded += " [layers] " + "; ".join(rolling.last_report)
        earlier = [t for t in _disk_history() + _HISTORY if t.key != trace.key]
        if earlier:
            grown_from, growth = _grown(trace, _HISTORY[-_GROWN_LOOKBACK:]) if cause == "read" else (None, "")
            old = grown_from or closest(trace, earlier)
            sites, text, where = explain(trace, old)
            if growth:
                text = f"{growth} {text}"
            rec = RecompileRecord(len(_LOG) + 1, sites[0] if sites else None, text + padded, trace.hex, old.hex,
                                  prog.compile_ns, cause, where, trace, sites)
        else:
            rec = RecompileRecord(len(_LOG) + 1, None, "first compile of the process: no earlier key to compare "
                                  "with" + padded, trace.hex, None, prog.compile_ns, cause, None, trace)
        _LOG.append(rec)
        _HISTORY.append(trace)
        if EXPLAIN:
            print(str(rec), file=sys.stderr)
