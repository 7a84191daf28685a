"""Sync and value read: collect -> post-order -> graph hash -> cache -> compile -> execute.

``sync()`` (R4) takes the storage of every live tensor with pending IR, in arena order
(``storage.pending()``), runs one program with ``force_ltc_data=true``, donating the buffers
that are safe to donate (R9), and gives each storage its new device buffer (``run_pending``,
which eager mode also runs after each op); then advances the RNG seed and counts
``MarkStep``. ``read_values()`` (R5) runs only the tensors read, with
``force_ltc_data=false``, and replaces nothing; inside a step that must be one program
(``set_read_guard``) it raises before running anything. Both look the program up by its graph
hash (``graph_hash``) in the LRU cache (``cache``), then in the persistent cache, and
compile on a miss (``compiler``); ``execution`` runs it. ``graph_key`` and ``dump_hlo``
(R10) answer what a sync would look up and what it would compile, compiling nothing.
A graph capture (``replay``) runs a sync's first half, ``plan_pending`` (collect, hash,
donation plan, lookup or compile), and a replay its last, ``end_step``; while a step is
captured, ``set_capture_guard`` makes every value read and sync raise.

Works on tensor states (``storage.TensorState``), never on torch tensors. May touch:
storages (their new buffers), the compilation caches, the RNG state, metrics, and the
subscribers in ``events``.
"""
from __future__ import annotations

import sys

from .. import dynamic, events
from . import host_reads
from .. import metrics
from ..compiler import persistent_cache
from ..ir import rng
from ..compiler.cache import CachedProgram, computation_cache
from ..compiler.compile import WorkspaceCall, arg_specs, compile_graph, hlo_text, rolled, with_extras
from ..config import env_flag
from ..run.execution import ExecutionError, raise_failed_checks, resolve, run, wait_device_ops  # noqa: F401  (wait_device_ops: API)
from ..keys.collect import Graph
from ..keys.graph_hash import FoldTrace, KeyRequest, compute
from ..run.storage import Storage, next_step, pending, reads_on_host, take_host, view_on_host
from ..errors import LazyXlaError
from ..dynamic import PaddedCall
from ..xla.client import auto_sharding, download, process_mesh, spmd

# R9.2: XLA_ENABLE_PARAM_ALIASING=0 turns buffer donation off (read once).
PARAM_ALIASING = env_flag("XLA_ENABLE_PARAM_ALIASING", True)


def buffer_donors(graph: Graph, synced) -> tuple:
    """R9: at a step barrier, the parameters whose storage is also an output of this
    execution (in-place updates), plus buffers the user marked; sorted. Every live tensor
    with pending IR is in this execution, so nothing else can still need those buffers."""
    if not PARAM_ALIASING or auto_sharding():
        return ()
    synced_ids = {id(st) for st in synced}
    donors = []
    for i, leaf in enumerate(graph.params):
        ref = leaf.owner
        st = ref() if ref is not None else None
        if st is not None and (id(st) in synced_ids or (st.donate and st.ir[0] is leaf)):
            donors.append(i)
    return tuple(donors)


def pair_donations(graph: Graph, storages, roots, donors):
    """The outputs ordered so that each donated parameter's buffer is given to the output that
    replaces it. JAX gives a donated input to the first output of its shape and dtype not yet
    paired, in order; paired with another tensor's output, the two buffers' lives cross and XLA
    copies the parameter in and the result out (two more kernels per buffer to compile and run:
    1346 copies in a 32-layer training step, where 174 of 192 donations crossed). So among the
    outputs of one shape and dtype, the donors' own tensors come first, in donor order, then the
    others as they were; outputs keep the places of their shape class, so that everything else
    (and a recompile's explanation, which compares tensors by place) sees the arena's order.
    Returns (storages, roots) in that order; ``graph.roots`` follows them."""
    if not donors:
        return storages, roots
    at = {id(st): k for k, st in enumerate(storages)}
    avals = [(r.sig.outs[j].shape, r.sig.outs[j].dtype) for r, j in graph.roots]
    first, taken = {}, set()  # shape class -> the donors' own outputs, in donor order
    for i in donors:
        leaf = graph.params[i]
        ref = leaf.owner
        st = ref() if ref is not None else None
        k = at.get(id(st)) if st is not None else None
        meta = leaf.sig.outs[0]
        if k is not None and k not in taken and avals[k] == (meta.shape, meta.dtype):
            taken.add(k)
            first.setdefault(avals[k], []).append(k)
    places = {}
    for k, a in enumerate(avals):
        if a in first:
            places.setdefault(a, []).append(k)
    order = list(range(len(storages)))
    for a, ks in first.items():
        for place, k in zip(places[a], ks + [k for k in places[a] if k not in taken]):
            order[place] = k
    if all(k == j for j, k in enumerate(order)):
        return storages, roots
    graph.roots = [graph.roots[k] for k in order]
    return [storages[k] for k in order], [roots[k] for k in order]


def _request(force_ltc_data, roots, graph, donors=()) -> KeyRequest:
    """What the key of ``roots`` ((tensor id, IR value) pairs, in order) is folded from."""
    return KeyRequest(force_ltc_data, roots, graph.sequence, donors, auto_sharding())


def _key(force_ltc_data, roots, graph, donors=()):
    """The graph key's trace for ``roots``."""
    return compute(_request(force_ltc_data, roots, graph, donors))


# A warm step asks for the same key every time: its ingredients (``KeyRequest.ingredients``)
# map to the trace of the program found for them, so the fold is not redone while that
# program is cached. Exact: equal ingredients fold to the same key.
_TRACES: dict = {}


def lookup(graph: Graph, req: KeyRequest, cause, donors=(), name="SyncTensorsGraph", pad=True,
           padded_for=None) -> CachedProgram:
    """Find the program for the key of ``req``, or compile and cache it; tell the subscribers.
    ``pad``: on a miss, a graph whose input sizes vary may run its padded twin's program.
    ``padded_for``: this is that twin, for (the exact graph's trace, the ``dynamic.Plan``)."""
    cache = computation_cache()
    ingredients = req.ingredients()
    known = _TRACES.get(ingredients)
    prog = cache.get(known.key) if known is not None else None
    compiled = False
    if prog is not None and not prog.retired:
        trace = FoldTrace.reusing(prog.trace, [uid for uid, _ in req.roots])
        metrics.counter_inc("CachedCompile")
        metrics.metric_add("TensorsGraphSize", len(graph.post))
        prog.hits += 1
    else:
        trace = compute(req)
        key = trace.key
        prog = cache.get(key)
        if prog is not None and not prog.retired:
            metrics.counter_inc("CachedCompile")
            metrics.metric_add("TensorsGraphSize", len(graph.post))
            prog.hits += 1
            trace.borrow_structure(prog.trace)
        else:
            trace.keep_structure_only()
            prog = _load_persistent(graph, trace, donors)
            if prog is not None:  # torch_xla: a persistent hit fills memory and counts CachedCompile
                if pad and dynamic.enabled():
                    dynamic.observe(graph)
                metrics.counter_inc("CachedCompile")
                metrics.metric_add("TensorsGraphSize", prog.graph_size)
            elif pad and (padded := _padded(graph, req, trace, cause, donors, name)) is not None:
                prog = CachedProgram(PaddedCall(padded[1], padded[0]), key, trace, len(graph.params),
                                     len(graph.roots), graph.n_ops, 0, tuple(donors), checks=padded[1].checks,
                                     extra={"dynamic": padded[0].summary, "padded": padded[1]})
            else:
                if auto_sharding():
                    raise LazyXlaError(
                        "lazyxla: auto-sharding (use_spmd(auto=True)) cannot compile: JAX 0.10 has no working "
                        "auto-partitioner (CompileOptions.use_auto_spmd_partitioning compiles a replicated program). "
                        f"The graph hash {trace.hex} was computed with auto-sharding on; annotate tensors with "
                        "lazyxla.distributed.spmd.mark_sharding and call use_spmd() without auto instead")
                metrics.counter_inc("UncachedCompile")
                for hook in events.BEFORE_COMPILE:
                    hook(cause, trace, graph)
                executable, ns, checks = compile_graph(graph, trace.hex, name, donors,
                                                       wrap_allowed=not auto_sharding())
                prog = CachedProgram(executable, key, trace, len(graph.params), len(graph.roots), graph.n_ops, ns,
                                     tuple(donors), checks=checks)
                if padded_for is not None:
                    prog.extra.update(padded_for=padded_for[0], dynamic=padded_for[1].summary)
                _store_persistent(prog, name)
                compiled = True
            cache.add(key, prog)
        if len(_TRACES) >= 4096:
            _TRACES.clear()
        _TRACES[ingredients] = prog.trace
    for hook in events.AFTER_LOOKUP:
        hook(cause, trace, prog, graph, compiled)
    return prog


def _padded(graph, req, trace, cause, donors, name):
    """A graph whose input sizes vary from one of its structure seen before runs the program of
    its padded twin (``dynamic``): (plan, that program, found or compiled), or None."""
    if not dynamic.enabled() or spmd() or process_mesh() is not None:
        return None
    plan = dynamic.plan(graph, Graph)
    if plan is None:
        return None
    pg = plan.graph
    roots = [(uid, v) for (uid, _), v in zip(req.roots, pg.roots)]
    pdonors = plan.donors(donors)
    preq = KeyRequest(req.force_ltc_data, roots, pg.sequence, pdonors, req.auto_sharding)
    try:
        return plan, lookup(pg, preq, cause, pdonors, name, pad=False, padded_for=(trace, plan))
    except ExecutionError as e:  # a rule's lowering failed: this structure stays exact-shape, said once
        dynamic.refuse(plan, f"its padded program did not compile ({e})")
        return None


def _load_persistent(graph, trace, donors):
    pcache = persistent_cache.get_cache()
    if pcache is None or process_mesh() is not None:  # a job's programs span its processes: not kept
        return None
    _, ws, n_rows = rolled(graph)  # a program with rolled loops takes and gives back their workspace
    got = pcache.load_checked(trace.key, arg_specs(graph, ws, n_rows), len(graph.roots) + len(ws))
    if got is None:
        return None
    fn = with_extras(got[0], graph, ws, n_rows)
    return CachedProgram(fn, trace.key, trace, len(graph.params), len(graph.roots), graph.n_ops, 0,
                         tuple(donors), extra={"persistent": True}, checks=got[1])


def _store_persistent(prog, name):
    pcache = persistent_cache.get_cache()
    if pcache is not None and process_mesh() is None:
        exe = prog.executable
        about = {"name": name, "fold": [s.as_dict() for s in prog.trace.steps], "checks": [list(c) for c in prog.checks]}
        pcache.store(prog.key, exe.compiled if type(exe) is WorkspaceCall else exe, about)


def _run(prog, graph):
    outs = run(prog.executable, [p.data for p in graph.params], prog.n_outputs, prog.key.hex(), checks=prog.checks)
    if type(prog.executable) is PaddedCall and outs:  # a padded program prices its runs (dynamic's bounds)
        prog.retired = prog.executable.ran(outs[0].completion)
    if events.AFTER_RUN:
        for hook in events.AFTER_RUN:
            hook(prog, graph, outs)
    return outs


# ---------------------------------------------------------------------------------------
def plan_pending(cause="sync"):
    """What a sync of all pending IR runs, found or compiled but not run: (storages, graph,
    program), the storages in arena order (the program's outputs, in that order), or None if
    nothing is pending. A graph capture (``replay``) stops here; a sync runs it."""
    storages, roots = pending()
    if not roots:
        return None
    graph = Graph([r for _, r in roots])
    donors = buffer_donors(graph, storages)
    storages, roots = pair_donations(graph, storages, roots, donors)
    return storages, graph, lookup(graph, _request(True, roots, graph, donors), cause, donors)


def run_pending():
    """Run all pending IR as one program (donating what is safe, R9) and give each storage its
    buffer: a sync without the end of the step (no seed advance, ``MarkStep`` or step hooks),
    which eager mode (``lazyxla.engine.eager``) runs after each op. Returns the program run (a
    ``cache.CachedProgram``), or None if nothing was pending."""
    plan = plan_pending()
    if plan is None:
        return None
    storages, graph, prog = plan
    Storage.set_all(storages, _run(prog, graph))
    return prog


def end_step():
    """The end of a step, after its program was dispatched: the seed moves on (R8), ``MarkStep``
    is counted and the step's subscribers run (step closures)."""
    rng.mark_step()
    next_step()
    metrics.counter_inc("MarkStep")
    for hook in events.AFTER_STEP:
        hook()


def sync(wait: bool = False):
    """R4: compile (or find) and run one program for all pending IR; replace it with data."""
    if _capture_guard is not None:
        _capture_guard("lazyxla.sync() (a step barrier)")
    raise_failed_checks()  # an earlier program that finished with a bad index (value checks)
    metrics.flush_pending(1024)  # a metric keeps its last XLA_METRICS_SAMPLES; reads flush the rest
    run_pending()
    end_step()
    if wait:
        wait_device_ops()


def _pending_roots(states, values):
    """(tensor id, IR value) of each distinct tensor whose value is still pending IR."""
    roots, seen = [], set()
    for s, v in zip(states, values):
        if v[0].data is None and s.uid not in seen:
            seen.add(s.uid)
            roots.append((s.uid, v))
    return roots


def read_values(states) -> list:
    """R5: the tensors' values on the host, as CPU tensors; pending IR is computed but kept.
    A view of device data (after a sync) is its storage's value viewed on the host."""
    if _capture_guard is not None:
        _capture_guard(None)
    metrics.flush_pending(1024)
    on_host = [reads_on_host(s) for s in states]
    computed = [s for s, h in zip(states, on_host) if not h]
    values = [s.value() for s in computed]
    arrays = {s.uid: v[0].data for s, v in zip(computed, values) if v[0].data is not None}
    roots = _pending_roots(computed, values)
    answered = {}
    if roots:
        if _read_guard is not None:  # lazyxla.compile(full_graph=True): raises at the user's line
            _read_guard()
        graph = Graph([r for _, r in roots])
        got = host_reads.answer(graph)  # over data the host just sent: no program, no wait
        if got is not None:
            answered = dict(zip((uid for uid, _ in roots), got))
        else:
            prog = lookup(graph, _request(False, roots, graph), "read")
            arrays.update(zip((uid for uid, _ in roots), _run(prog, graph)))
    fetch = [(s, h) for s, h in zip(states, on_host) if s.uid not in answered]
    hosts = iter(download([resolve(s.storage.data if h else arrays[s.uid]) for s, h in fetch],
                          [(s.storage.meta if h else s.meta).dtype for s, h in fetch]))
    out = []
    for s, h in zip(states, on_host):
        x = answered.get(s.uid)
        if x is None:
            x = next(hosts)
            x = view_on_host(x, s.chain).clone() if h else x
        out.append(x)
    return out


def settle(states) -> list:
    """``read_values`` of the tensors, then each pending one (not a view) takes its value as
    device data sent by the host: a later sync does not compute it again. Small preparations
    over a step's uploads (HF's mask and positions for a prompt) are answered on the host
    (``host_reads``), so they cost no program at a new length."""
    hosts = read_values(states)
    for s, h in zip(states, hosts):
        take_host(s, h)
    return hosts


def graph_key(states):
    """The trace of the key a sync would look up if these were all the pending tensors
    (donation included); nothing is compiled or run."""
    roots = _pending_roots(states, [s.value() for s in states])
    graph = Graph([r for _, r in roots])
    synced = [s.storage for s in states if s.storage.data is None]
    donors = buffer_donors(graph, synced)
    by_uid = {s.uid: s.storage for s in states}
    _, roots = pair_donations(graph, [by_uid[uid] for uid, _ in roots], roots, donors)
    return _key(True, roots, graph, donors)


def dump_hlo(states) -> str:
    """R10: the program text for the tensors' pending IR; no hash, cache, compile or run."""
    roots = [s.value() for s in states]
    roots = [v for v in roots if v[0].data is None] or roots
    return hlo_text(Graph(roots))


# ---------------------------------------------------------------------------------------
# What a value read is, by the lazyxla function that asked for it (the caller of read_values).
_READS = {
    "__repr__": "print()/repr() of a tensor",
    "_local_scalar_dense": ".item() (a Python number from a tensor: item(), float(), int(), bool(), an if on it)",
    "_to_copy": ".cpu() / .to('cpu') (a copy to the host)",
    "_copy_": "a copy into a CPU tensor",
    "tolist": ".tolist()",
    "numpy": ".numpy()",
    "fallback": "an op without a lowering, which runs on the CPU",
}


def describe_read() -> str:
    """What is reading a value, said by the lazyxla function that called ``read_values``
    (for a refusal's message)."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_name != "read_values":
        f = f.f_back
    caller = f.f_back if f is not None else None
    if caller is None:
        return "a value read"
    name = caller.f_code.co_name
    if name == "fallback":
        info = caller.f_locals.get("info")
        op = getattr(info, "name", None)
        if op:
            return f"{op} (no lowering: it runs on the CPU, reading its inputs)"
    return _READS.get(name, f"a value read ({name})")


# ---------------------------------------------------------------------------------------
# Guards: a step that must be one program (``lazyxla.replay.compiled_step``, ``full_graph=True``) and
# a step being captured (``replay``).
_read_guard = None     # called before a value read runs a program; raises (full_graph=True)
_capture_guard = None  # called with what is asked (None: a value read) while a step is captured


def set_capture_guard(guard):
    """While a step is captured (``replay``), ``guard(what)`` is called before any value read
    or sync and raises; ``None`` lifts it. Returns the guard it replaces."""
    global _capture_guard
    old, _capture_guard = _capture_guard, guard
    return old


def set_read_guard(guard):
    """While a step that must be one program is traced (``lazyxla.compile(full_graph=True)``),
    ``guard()`` is called when a value read would run a program, and raises; ``None`` lifts it.
    Returns the guard it replaces."""
    global _read_guard
    old, _read_guard = _read_guard, guard
    return old
