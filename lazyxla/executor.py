"""Sync and value read: collect -> post-order -> graph hash -> cache -> compile -> execute.

``sync()`` (R4) takes every live tensor's storage with pending IR, in arena order, runs one
program with ``force_ltc_data=true`` and replaces each storage's IR with its new device
buffer; then advances the seed and counts ``MarkStep``. ``read_values()`` (R5) runs only the
tensors read, with ``force_ltc_data=false``, and replaces nothing. Both look the program up
by its graph hash in the LRU cache and compile on a miss.

Execution is asynchronous: JAX returns the output buffers at once; a completion thread
waits on them to record ``ExecuteTime`` and catch failures, which surface at the next
``wait_device_ops()`` or value read, naming the graph's hash.

May touch: storages of live tensors, the compilation cache, the RNG state, metrics.
"""
from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait

import contextlib
import os
import threading

import jax

from . import graph_hash, metrics, persistent_cache, rng
from .cache import CachedProgram, computation_cache
from .ir import post_order
from .lowering import build_program
from .tensor import live_tensors, value_of

_now = metrics.now_ns
# R9.2: XLA_ENABLE_PARAM_ALIASING=0 turns buffer donation off (read once).
PARAM_ALIASING = os.environ.get("XLA_ENABLE_PARAM_ALIASING", "1").lower() not in ("0", "false", "")
# R11: at or above this many parameters the program takes one tuple parameter (read once;
# torch_xla's spelling of the variable).
WRAP_THRESHOLD = int(os.environ.get("XLA_PARAMETER_WRAPPING_THREADSHOLD", "3200"))
LAST_TRACE = None  # graph_hash.FoldTrace of the most recent cache lookup


class ExecutionError(RuntimeError):
    """An XLA program failed; raised at the next wait or value read."""


# ---------------------------------------------------------------------------------------
# Asynchronous execution (R4.4). JAX dispatches a program on the CPU asynchronously: the call
# returns its output arrays at once and XLA's threads compute them, so tracing the next step
# overlaps this one. One completion thread waits on each program in order, to record
# ExecuteTime and to catch a failure, which surfaces at the next wait or value read.
_waiter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lazyxla-exec")
MAX_INFLIGHT = 2
_inflight = deque()  # completion futures not yet waited on by wait_device_ops, oldest first
_last_done = 0  # when the previous program finished (ExecuteTime counts from then if later)


class Placeholder:
    """An output buffer of a dispatched program: the array (perhaps not computed yet) and
    the program's completion, which says whether it failed."""

    __slots__ = ("future", "array")

    def __init__(self, future, array):
        self.future = future
        self.array = array

    def get(self):
        """The computed array; waits for the program and raises if it failed."""
        err = self.future.exception()
        if err is not None:
            try:  # reported here: the next wait_device_ops() does not report it again
                _inflight.remove(self.future)
            except ValueError:
                pass
            # a fresh exception: re-raising the stored one would pin the caller's frames
            raise ExecutionError(str(err)) from None
        return self.array


def resolve(d, wait=True):
    """The jax.Array behind a storage's data; raises if its program failed or its buffer was
    donated. ``wait=False`` (an input to the next program) does not wait for it to be computed:
    only a failure already known is raised."""
    if type(d) is Placeholder:
        if wait:
            d = d.get()
        else:
            f = d.future
            if f.done() and f.exception() is not None:
                raise ExecutionError(str(f.exception()))
            d = d.array
    if d.is_deleted():
        raise ExecutionError("lazyxla: this device buffer was donated to a program "
                             "(lazyxla.set_buffer_donation) and no longer exists")
    return d


def _await(outs, key, t0):
    for a in outs:
        try:
            a.block_until_ready()
        except Exception as e:  # noqa: BLE001 - surfaced at the next wait or read
            if a.is_deleted():
                continue  # donated to a later program, which waits on it (and fails if it failed)
            raise ExecutionError(f"lazyxla: execution of graph {key.hex()} failed: {type(e).__name__}: {e}") from None
    global _last_done
    t1 = _now()
    metrics.metric_add("ExecuteTime", t1 - max(t0, _last_done), "time")
    _last_done = t1


def _failed(message):
    f = Future()
    f.set_exception(ExecutionError(message))
    return f


def wait_device_ops():
    """Wait for every scheduled execution; raise the first failure since the last wait."""
    futures = list(_inflight)
    for _ in futures:
        _inflight.popleft()
    first = None
    for f in futures:
        e = f.exception()
        if e is not None and first is None:
            first = e
    if first is not None:
        raise ExecutionError(str(first)) from None


# ---------------------------------------------------------------------------------------
class Graph:
    """What a lookup needs: roots, post-order, parameters and the parameter sequence.

    The parameter sequence lists, for every use of a device-data leaf by an op node (op
    nodes in post-order, operands in order), the index of the parameter it binds. Leaves
    hash only shape and dtype, so this is what tells ``x - y + x`` from ``x - y + y``.
    """

    __slots__ = ("roots", "post", "params", "sequence")

    def __init__(self, roots):
        self.roots = roots
        post = post_order(roots)
        self.post = post
        params, seq, index = [], [], {}
        for n in post:
            d = n.data
            if d is not None:
                if id(d) not in index:
                    index[id(d)] = len(params)
                    params.append(n)
                continue
            for o, _ in n.operands:
                od = o.data
                if od is not None:
                    seq.append(index[id(od)])
        self.params = params
        self.sequence = seq


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


def auto_sharding() -> bool:
    return False  # R12's auto-sharding is not implemented yet


def _lookup(graph: Graph, trace, cause, donors=(), name="SyncTensorsGraph") -> CachedProgram:
    """Find the program by its key, or compile and cache it; tell the observers."""
    global LAST_TRACE
    LAST_TRACE = trace
    cache = computation_cache()
    key = trace.key
    prog = cache.get(key)
    if prog is not None:
        metrics.counter_inc("CachedCompile")
        metrics.metric_add("TensorsGraphSize", len(graph.post))
        prog.hits += 1
        compiled = False
        _borrow_skeletons(trace, prog.trace)
    else:
        _keep_skeletons(trace)
        prog = _load_persistent(graph, trace, donors)
        if prog is not None:  # torch_xla: a persistent hit fills memory and counts CachedCompile
            metrics.counter_inc("CachedCompile")
            metrics.metric_add("TensorsGraphSize", prog.graph_size)
            compiled = False
        else:
            metrics.counter_inc("UncachedCompile")
            for obs in OBSERVERS:
                obs.before_compile(cause, trace, graph)
            prog = _compile(graph, trace, name, donors)
            _store_persistent(prog, name)
            compiled = True
        cache.add(key, prog)
    for obs in OBSERVERS:
        obs.after_lookup(cause, prog, graph, compiled)
    return prog


def _load_persistent(graph, trace, donors):
    pcache = persistent_cache.get_cache()
    if pcache is None:
        return None
    fn = pcache.load(trace.key, _specs(graph), len(graph.roots))
    if fn is None:
        return None
    n_ops = sum(1 for n in graph.post if n.data is None)
    return CachedProgram(fn, trace.key, trace, len(graph.params), len(graph.roots), n_ops, 0, tuple(donors),
                         extra={"persistent": True})


def _store_persistent(prog, name):
    pcache = persistent_cache.get_cache()
    if pcache is not None:
        pcache.store(prog.key, prog.executable, {"name": name, "fold": [s.as_dict() for s in prog.trace.steps]})


def _borrow_skeletons(trace, cached):
    """A hit has the cached program's key, so the cached trace's IR skeletons describe this
    graph too: use them, and the kept trace pins none of this step's buffers."""
    old = [st for st in cached.steps if st.site == "tensors"]
    new = [st for st in trace.steps if st.site == "tensors"]
    for st, o in zip(new, old):
        if st.detail is not None and o.detail is not None:
            st.detail = (st.detail[0], o.detail[1])


def _keep_skeletons(trace):
    """A cached trace must not pin the step's buffers: keep the IR's structure only."""
    from .ir import skeleton
    memo = {}
    for st in trace.steps:
        if st.site == "tensors" and st.detail is not None:
            uid, value = st.detail
            st.detail = (uid, skeleton(value, memo))


def _compile(graph: Graph, trace, name, donors=()) -> CachedProgram:
    fn = build_program(graph.post, graph.roots, graph.params)
    fn.__name__ = name
    specs = _specs(graph)
    wrap = len(specs) >= WRAP_THRESHOLD and not auto_sharding()
    t0 = _now()
    try:
        with _tupled_parameters(wrap):
            lowered = jax.jit(fn, donate_argnums=donors).lower(*specs)
            compiled = lowered.compile()
    except Exception as e:
        raise ExecutionError(_describe_failure("compile", trace, graph, e)) from e
    dt = _now() - t0
    metrics.metric_add("CompileTime", dt, "time")
    metrics.counter_inc("CreateCompileHandles")
    n_ops = sum(1 for n in graph.post if n.data is None)
    metrics.metric_add("TensorsGraphSize", n_ops)
    metrics.metric_add("InputOutputAliasCount", len(donors))
    return CachedProgram(compiled, trace.key, trace, len(graph.params), len(graph.roots), n_ops, dt,
                         tuple(donors))


@contextlib.contextmanager
def _tupled_parameters(on: bool):
    """R11: JAX tuples a program's parameters (XLA's parameter_is_tupled_arguments) when its
    dispatch.should_tuple_args says so; lazyxla says so above the wrapping threshold. The
    runtime still passes the flat argument list."""
    if not on:
        yield
        return
    from jax._src import dispatch as jax_dispatch
    with _WRAP_LOCK:
        orig = jax_dispatch.should_tuple_args
        jax_dispatch.should_tuple_args = lambda num_args, platform: True
        try:
            yield
        finally:
            jax_dispatch.should_tuple_args = orig


_WRAP_LOCK = threading.Lock()


def _specs(graph):
    from .runtime import jnp_dtype
    return [jax.ShapeDtypeStruct(p.sig.outs[0].shape, jnp_dtype(p.sig.outs[0].dtype)) for p in graph.params]


def _describe_failure(what, trace, graph, e):
    ops = sorted({n.sig.op for n in graph.post if n.data is None})
    wheres = [n.where for n in graph.post if n.where]
    loc = ""
    if wheres:
        from .ir import fmt_where
        loc = f"; the graph was recorded from {fmt_where(wheres[0])} to {fmt_where(wheres[-1])}"
    return (f"lazyxla: could not {what} graph {trace.hex} ({len(graph.post)} nodes, ops: "
            f"{', '.join(ops[:20])}){loc}: {type(e).__name__}: {e}")


def _execute(prog: CachedProgram, graph: Graph):
    """Dispatch the program; returns one Placeholder per root, at once.

    At most ``MAX_INFLIGHT`` programs are in flight (torch_xla's device lock allows one):
    tracing the next steps overlaps running this one, and a runaway queue cannot pin many
    steps' buffers. A failure to dispatch surfaces at the next wait or read, as one while
    running does.
    """
    if len(_inflight) >= MAX_INFLIGHT:
        wait([_inflight[-MAX_INFLIGHT]])
    key = prog.key
    try:
        args = [resolve(p.data, wait=False) for p in graph.params]
    except ExecutionError as e:
        fut, outs = _failed(f"lazyxla: graph {key.hex()} not run: an input comes from a failed graph ({e})"), None
    else:
        t0 = _now()
        try:
            outs = prog.executable(*args)
        except Exception as e:  # noqa: BLE001 - surfaced at the next wait or read
            fut, outs = _failed(f"lazyxla: execution of graph {key.hex()} failed: {type(e).__name__}: {e}"), None
        else:
            fut = _waiter.submit(_await, outs, key, t0)
    while _inflight and _inflight[0].done() and _inflight[0].exception() is None:
        _inflight.popleft()  # finished cleanly: nothing to report
    _inflight.append(fut)
    metrics.counter_inc("ExecuteComputation")
    if outs is None:
        return [Placeholder(fut, None) for _ in range(prog.n_outputs)]
    return [Placeholder(fut, a) for a in outs]


_TRACE_NS = metrics.pending_samples("LazyTracing", "time")  # dispatch appends one per traced op


def _flush_tracing():
    if len(_TRACE_NS) >= 1024:  # a metric keeps its last XLA_METRICS_SAMPLES; reads flush the rest
        metrics.flush_pending()


# ---------------------------------------------------------------------------------------
def _fold(force_ltc_data, roots, graph, donors=()):
    """The graph key's trace for ``roots``: (tensor id, IR value) pairs, in order."""
    return graph_hash.compute(force_ltc_data, [(v[0].vh[v[1]], (uid, v)) for uid, v in roots],
                              graph.sequence, donors)


def _pending_roots(tensors, values=None):
    """(tensor id, IR value) of each distinct tensor whose value is still pending IR."""
    roots, seen = [], set()
    for t, v in zip(tensors, values or map(value_of, tensors)):
        if v[0].data is None and t._uid not in seen:
            seen.add(t._uid)
            roots.append((t._uid, v))
    return roots


def sync(wait: bool = False):
    """R4: compile (or find) and run one program for all pending IR; replace it with data."""
    _flush_tracing()
    storages, roots, seen = [], [], set()
    for t in live_tensors():
        st = t._st
        sid = id(st)
        if sid in seen:
            continue
        seen.add(sid)
        if st.data is None:
            storages.append(st)
            roots.append((t._uid, st.ir))
    if roots:
        graph = Graph([r for _, r in roots])
        donors = buffer_donors(graph, storages)
        prog = _lookup(graph, _fold(True, roots, graph, donors), "sync", donors)
        outs = _execute(prog, graph)
        for st, arr in zip(storages, outs):
            st.set_data(arr)
    rng.mark_step()
    metrics.counter_inc("MarkStep")
    for obs in OBSERVERS:
        step = getattr(obs, "after_step", None)
        if step is not None:
            step()
    if wait:
        wait_device_ops()


def read_values(tensors) -> list:
    """R5: the tensors' values on the host; pending IR is computed but kept."""
    _flush_tracing()
    values = [value_of(t) for t in tensors]
    arrays = {t._uid: v[0].data for t, v in zip(tensors, values) if v[0].data is not None}
    roots = _pending_roots(tensors, values)
    if roots:
        graph = Graph([r for _, r in roots])
        prog = _lookup(graph, _fold(False, roots, graph), "read")
        arrays.update(zip((uid for uid, _ in roots), _execute(prog, graph)))
    from .runtime import download
    return download([resolve(arrays[t._uid]) for t in tensors], [t._meta.dtype for t in tensors])


def graph_key(tensors):
    """The trace of the key a sync would look up if these were all the pending tensors
    (donation included); nothing is compiled or run."""
    roots = _pending_roots(tensors)
    graph = Graph([r for _, r in roots])
    storages = [t._st for t in tensors if t._st.data is None]
    return _fold(True, roots, graph, buffer_donors(graph, storages))


def dump_hlo(tensors) -> str:
    """R10: the program text for the tensors' pending IR; no hash, cache, compile or run."""
    roots = [value_of(t) for t in tensors]
    roots = [v for v in roots if v[0].data is None] or roots
    graph = Graph(roots)
    fn = build_program(graph.post, graph.roots, graph.params)
    fn.__name__ = "IrToHlo"
    specs = _specs(graph)
    lowered = jax.jit(fn).lower(*specs)
    try:
        return lowered.compiler_ir("hlo").as_hlo_text()
    except Exception:  # noqa: BLE001 - older/newer JAX: fall back to StableHLO text
        return lowered.as_text()


# ---------------------------------------------------------------------------------------
# Observers of lookups (diagnostics): objects with before_compile(cause, trace, graph) and
# after_lookup(cause, program, graph, compiled). cause is "sync" or "read".
OBSERVERS: list = []
