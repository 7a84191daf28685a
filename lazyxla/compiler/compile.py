"""Lower and compile: a ``Graph`` becomes one XLA program through ``jax.jit``.

``compile_graph`` builds the program function from the post-order with its repeated layers
rolled (``rolling``; their loops' stacked outputs go to a workspace kept between runs,
``WorkspaceCall``) (``lowering.build_program``),
lowers it for the parameters' shapes and dtypes, and compiles it, donating the given
parameters (R9) and tupling the parameters at or above ``XLA_PARAMETER_WRAPPING_THREADSHOLD``
(3200, torch_xla's spelling; R11); a program with value checks has one more output
(``lowering.program``). ``hlo_text`` lowers the same function and returns the
program text without compiling (R10). A failure names the graph's hash, its ops and the
user's lines that recorded them (an ``ExecutionError``).

May touch: the compile metrics (``CompileTime``, split into ``CompileRollTime`` (``rolling``),
``CompileTraceTime`` (the program
function traced: lazyxla's lowerings), ``CompileLowerTime`` (JAX to MLIR) and
``CompileBackendTime`` (XLA); ``CreateCompileHandles``,
``TensorsGraphSize``, ``InputOutputAliasCount``). Reads the wrapping threshold once. Passes
XLA the options ``OPTION_RULES`` give a program by the ops it holds. After a
compile, gives the heap the compiler freed back to the system (glibc's ``malloc_trim``).
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import sys

import jax

from .. import metrics, rolling
from ..config import env_int
from ..run.execution import ExecutionError
from ..ir.user_line import fmt_where
from ..xla import precision, widths
from ..xla.jax_internals import tupled_parameters
from ..lowering import build_program, row_args
from ..xla.client import compile_environment, jax_device, jnp_dtype, process_mesh, row_indices, spmd, zeros

WRAP_THRESHOLD = env_int("XLA_PARAMETER_WRAPPING_THREADSHOLD", 3200)

# XLA options a program compiles with: each rule whose platform is the device's and whose
# ``when`` holds for the graph adds its options, unless ``XLA_FLAGS`` sets them (the user's
# choice, and part of the compile environment; the options follow from the graph and the
# platform, so a graph hash names them too). ``when``: "no loop" (a program without a loop,
# rolled or scanned), ("holds", ops) (a program holding one of the ops) or ("at most", n) (a
# program of at most n op nodes).
# (when, platform, options, what was measured)
OPTION_RULES = (
    ("no loop", "cpu", {"xla_backend_optimization_level": 1},
     "LLVM at O1 instead of XLA's default for the kernels XLA:CPU emits itself (dots and "
     "convolutions are YNNPACK's and Eigen's either way). At the default, LLVM unrolls a small "
     "kernel's loops whole: a softmax kernel of 2x4x16x16 alone compiled in 0.3-0.5 s, 0.05 s at "
     "O1. Same runs, with and without: a 2-layer HF GPT-2 (128 wide, 2 x 16 tokens) spent 0.95 s "
     "in LLVM against 1.34-1.53 (its slowest kernel 0.03 s against 0.12-0.14); tests/test_rolling.py "
     "and tests/test_zoo.py ran in 116 s against 134; bench/models.py's GPT-2, BERT and ResNet-18 "
     "steps as fast (replayed GPT-2 251-273 against 273-317 ms), their losses the same to the last "
     "digit. Not for a program with a loop: kernels a loop's body computes in place unroll whole "
     "at O1 too and compiled slower than at the default (a narrow GPT-2's two softmax kernels "
     "1.08 s against 0.67-0.75, its program recompiled standalone)."),
    (("holds", ("aten::convolution", "aten::convolution_backward")), "cpu", {"xla_cpu_use_fusion_emitters": False},
     "XLA:CPU's MLIR fusion emitters spend 2-3x the memory of its older loop emitters on each "
     "kernel, and a convolution network's batch norms and patches are hundreds of kernels: "
     "ResNet-18's training step (bench/models.py) compiled in 3.3 s at a peak of 1030-1080 MB, "
     "2.5 s at 850 MB without them, its step as fast. Not for every program: a transformer's "
     "step compiles 25-35% slower without them (HF BERT 4x256: 1.2-1.4 -> 1.7 s)."),
    (("at most", 200), "cpu", {"xla_cpu_use_fusion_emitters": False},
     "A small program's kernels with the older loop emitters compile in 0.45-0.7x the time the "
     "MLIR fusion emitters take (fixed costs per kernel), loop or not. 512 programs of the "
     "test suite, each compiled both ways in one process: 405 of under 10 op nodes 0.24 -> 0.16 s "
     "each, 100 of 10-300 nodes 1.1 -> 0.7 s (some rolled loops 2-4 s -> 0.7-0.9 s). Their run "
     "time is the same (a 1024x1024 elementwise chain, softmax or layer norm 0.97-1.4 ms either "
     "way; 64x64 ones 0.05-0.3 ms, a few hundredths of a ms slower). Not for a model's step: a "
     "4-layer GPT-2 or BERT (bench/models.py) compiled 30% slower without them and stepped "
     "5-20% slower; a 2-layer GPT-2 (240 nodes) within noise either way; a 1-layer one 512 wide "
     "(138 nodes) 2.2 -> 2.0 s."),
)


def xla_options(graph) -> dict:
    """The XLA options ``OPTION_RULES`` give this graph's program (an empty dict: XLA's own)."""
    held = {n.sig.op for n in graph.post}
    loop = not held.isdisjoint(LOOP_OPS) or (graph.rolled is not None and
                                             any(type(n) is rolling.Loop for n in graph.rolled[0][0]))
    return options_for(held, loop, graph.n_ops)


def options_for(held, loop: bool, n_ops: int) -> dict:
    """The XLA options ``OPTION_RULES`` give a program of ``n_ops`` op nodes holding the ops
    ``held`` (with a loop or not). The platform and ``XLA_FLAGS`` are the compile environment's,
    read once, as XLA reads them."""
    env = compile_environment()

    def applies(when):
        if when == "no loop":
            return not loop
        kind, arg = when
        if kind == "holds":
            return not held.isdisjoint(arg)
        assert kind == "at most", when
        return n_ops <= arg
    return {k: v for when, on, options, _ in OPTION_RULES
            if on == env["platform"] and not any(f"--{k}=" in env["XLA_FLAGS"] for k in options)
            and applies(when) for k, v in options.items()}


LOOP_OPS = ("lazyxla::scan", "lazyxla::scan_vjp")  # regions.scan's loops (rolled ones: rolling.Loop)


def specs(graph) -> list:
    """The abstract values (shape, dtype) of the graph's parameters; under SPMD with their
    shardings too (a program is compiled for its inputs' layouts)."""
    shard = spmd()
    return [jax.ShapeDtypeStruct(p.sig.outs[0].shape, jnp_dtype(p.sig.outs[0].dtype),
                                 sharding=getattr(p.data, "array", p.data).sharding if shard else None)
            for p in graph.params]


def _per_process_mesh():
    """The process mesh when programs run once per process of a job (not under SPMD, where a
    program spans the processes' devices by its shardings); None otherwise."""
    return None if spmd() else process_mesh()


def rolled(graph, count=True):
    """The graph's post-order with its repeated layers rolled (``rolling``), the workspace its
    loops' stacked outputs need (abstract values: arguments after the parameters and outputs
    after the roots, ``WorkspaceCall``) and how many row indices the program takes
    (``lowering.row_args``). Under SPMD or in a job of several processes: the graph as it is,
    neither. Found once per graph (a persistent-cache lookup asks first, then the compile);
    ``count``: the metrics count it (not for a program's text, which leaves them unchanged: R10)."""
    if spmd() or process_mesh() is not None:
        return graph.post, [], 0
    if graph.rolled is not None:
        return graph.rolled[0]
    t0 = metrics.now_ns()
    post = rolling.roll(graph.post, graph.roots, count)
    found = post, [w for n in post if type(n) is rolling.Loop for w in n.workspace()], row_args(post)
    if count:
        graph.rolled = found, metrics.now_ns() - t0
        metrics.metric_add("CompileRollTime", graph.rolled[1], "time")
    return found


ROW_INDEX = jax.ShapeDtypeStruct((), "int32")  # a row-index argument's abstract value


def values(graph):
    """The shapes and dtypes (TensorMetas) of a graph's values (its post-order holds its
    parameters): what decides whether it is traced in JAX's 32-bit mode (``xla.widths.scope``)."""
    for n in graph.post:
        sig = getattr(n, "sig", None)
        if sig is not None:
            yield from sig.outs


def ends(graph):
    """The TensorMetas of a graph's arguments and results."""
    for p in graph.params:
        yield from p.sig.outs
    for r, i in graph.roots:
        yield r.sig.outs[i]


def arg_specs(graph, ws, n_rows) -> list:
    """A program's abstract arguments: its parameters', its workspace's, its row indices'."""
    return specs(graph) + ws + [ROW_INDEX] * n_rows


def with_extras(compiled, graph, ws, n_rows):
    """``compiled`` as the executor calls it: given its workspace and row indices (a
    ``WorkspaceCall``) when it takes any."""
    return WorkspaceCall(compiled, ws, len(graph.roots), n_rows) if ws or n_rows else compiled


class WorkspaceCall:
    """A program whose rolled loops write their stacked outputs into buffers kept from one run
    to the next: they are its arguments after the parameters (donated) and its outputs after the
    roots, so no step fills them first (XLA:CPU has no uninitialized buffers: a fill of every
    saved value made a rolled GPT-2 step ~10% slower); then its row indices, ``rows`` int32
    scalars 0, 1, ... (``lowering.row_args``; never donated). Called like the program without
    either."""

    __slots__ = ("compiled", "specs", "n_roots", "ws", "rows")

    def __init__(self, compiled, specs, n_roots, rows=0):
        self.compiled = compiled
        self.specs = specs
        self.n_roots = n_roots
        self.ws = None
        self.rows = row_indices(rows)

    def __call__(self, *arrays):
        ws, self.ws = self.ws, None  # donated: a failed run starts the next from new buffers
        if ws is None:
            ws = [zeros(s.shape, s.dtype) for s in self.specs]
        outs = self.compiled(*arrays, *ws, *self.rows)
        n, k = self.n_roots, len(self.specs)
        self.ws = list(outs[n:n + k])
        return tuple(outs[:n]) + tuple(outs[n + k:])

    def __getattr__(self, name):  # as_text(), cost_analysis(), ... of the compiled program
        return getattr(self.compiled, name)


def _function(graph, name, count=True):
    """The program's function, its abstract arguments (the parameters', the workspace's
    (``rolled``), the row indices' (``lowering.row_args``)), its workspace and how many row
    indices it takes; in a job
    of several processes, the function runs on every process's device under ``shard_map`` with
    the process axis bound (each process's arrays are its own block of a global array that
    claims to be replicated: the body is per-process code, and only the collectives cross
    processes)."""
    post, ws, n_rows = rolled(graph, count)
    body = fn = build_program(post, graph.roots, graph.params, workspace=len(ws), row_args=n_rows)
    fn.__name__ = name
    args = arg_specs(graph, ws, n_rows)
    mesh = _per_process_mesh()
    if mesh is None:
        return fn, args, body, ws, n_rows
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    fn = jax.shard_map(fn, mesh=mesh, in_specs=tuple(jax.sharding.PartitionSpec() for _ in args),
                       out_specs=jax.sharding.PartitionSpec(), check_vma=False)
    return fn, [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep) for a in args], body, ws, n_rows


class ProcessProgram:
    """A program compiled for the process mesh, called like a one-device one: each local
    array is wrapped (no copy) as this process's block of a global array, and each output
    unwrapped to this process's block."""

    __slots__ = ("compiled", "sharding")

    def __init__(self, compiled, mesh):
        self.compiled = compiled
        self.sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def __call__(self, *arrays):
        wrap, sh = jax.make_array_from_single_device_arrays, self.sharding
        outs = self.compiled(*[wrap(a.shape, sh, [a]) for a in arrays])
        return tuple(o.addressable_data(0) for o in outs)

    def __getattr__(self, name):  # as_text(), cost_analysis(), ... of the compiled program
        return getattr(self.compiled, name)


def _libc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to give back this way
        return None


_TRIM = _libc_trim() if sys.platform.startswith("linux") else None


def _give_back_freed_memory():
    """Return the heap the compile used and freed to the system (glibc keeps it otherwise), so
    the program's buffers reuse those pages instead of adding to them: ResNet-18's training
    step peaked at 1225 MB resident, 1104 MB with the trim (a full cycle collection after it
    found nothing more to free and cost 50-130 ms). That is XLA:CPU, whose buffers are this
    heap's: the trim runs there before the program's first run. An accelerator's buffers are
    its own memory, and there is no trim: after XLA's TPU compile of GPT-2 124M it took 1.37 s
    of the first step (a v5e's host), and run on a thread beside the steps (``malloc_trim``
    holds the heap's lock) the first five steps of ``bench/tpu.py`` took 141.5 ms each; without
    it the first ten 89.6 ms, the next ten 70.4 (2026-12-07)."""
    if _TRIM is not None and jax_device().platform == "cpu":
        _TRIM(0)


@contextlib.contextmanager
def _no_cycle_collection():
    """Python's cycle collector paused while a program compiles (``compile_graph``): a compile
    allocates ~10^5 small objects (IR indexes, JAX's tracers), each batch of which set off a
    pass over every object of a heap that holds torch, JAX and the user's model (rolling HF
    Llama's 32 layers: 300 ms, 190 without; whatever cycles the compile leaves, the collector
    finds when it runs next)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def compile_graph(graph, key_hex: str, name: str, donors=(), wrap_allowed=True):
    """The compiled program (a ``jax.stages.Compiled``, or a ``ProcessProgram`` around one in a
    job of several processes), what compiling it cost (ns), and its value checks (one more
    output when there are any: ``lowering.program``)."""
    # (rolled before, for a persistent-cache lookup: that time is the compile's too)
    t0 = metrics.now_ns() - (graph.rolled[1] if graph.rolled is not None else 0)
    with _no_cycle_collection():
        # the program's module is named for its key (``jit_SyncTensorsGraph_<key>``): a profile's ops name it
        fn, args, body, ws, n_rows = _function(graph, f"{name}_{key_hex[:12]}")  # rolls the graph's layers
        tf = metrics.now_ns()
        try:
            with tupled_parameters(wrap_allowed and len(args) >= WRAP_THRESHOLD), precision.scope():
                donate = tuple(donors) + tuple(range(len(graph.params), len(graph.params) + len(ws)))
                lowered, t1 = _trace_and_lower(jax.jit(fn, donate_argnums=donate), args, graph)
                t2 = metrics.now_ns()
                compiled = lowered.compile(xla_options(graph) or None)    # XLA's passes and code generation
        except Exception as e:
            raise ExecutionError(describe_failure("compile", key_hex, graph, e)) from e
    t3 = metrics.now_ns()
    del lowered
    _give_back_freed_memory()
    mesh = _per_process_mesh()
    if mesh is not None:
        compiled = ProcessProgram(compiled, mesh)
    compiled = with_extras(compiled, graph, ws, n_rows)
    dt = metrics.now_ns() - t0
    metrics.metric_add("CompileTime", dt, "time")
    metrics.metric_add("CompileTraceTime", t1 - tf, "time")
    metrics.metric_add("CompileLowerTime", t2 - t1, "time")
    metrics.metric_add("CompileBackendTime", t3 - t2, "time")
    metrics.counter_inc("CreateCompileHandles")
    metrics.metric_add("TensorsGraphSize", graph.n_ops)
    metrics.metric_add("InputOutputAliasCount", len(donors))
    return compiled, dt, body.checks


def _trace_and_lower(jitted, args, graph, **lower):
    """The program traced (lazyxla's lowerings run here) and lowered by JAX to MLIR (``lower``:
    ``Traced.lower``'s options), and when the trace ended: with int64 held in 32 bits, in JAX's
    32-bit mode (``xla.widths``), or where that fails, once more as before (``WideIntegerTrace``
    counts those)."""
    if widths.traced_narrow(values(graph), ends(graph)):
        try:
            with widths.scope(True):
                traced = jitted.trace(*args)
                if not widths.holds_int64(traced.jaxpr):
                    t1 = metrics.now_ns()
                    return traced.lower(**lower), t1
        except Exception:  # noqa: BLE001 - the trace below raises whatever is the graph's own error
            pass
        metrics.counter_inc("WideIntegerTrace")
    traced = jitted.trace(*args)
    t1 = metrics.now_ns()
    return traced.lower(**lower), t1


def hlo_text(graph) -> str:
    """The program text of the graph (HLO; StableHLO where JAX offers no HLO text)."""
    fn, args, *_ = _function(graph, "IrToHlo", count=False)
    with precision.scope():
        lowered, _ = _trace_and_lower(jax.jit(fn), args, graph)
    try:
        return lowered.compiler_ir("hlo").as_hlo_text()
    except Exception:  # noqa: BLE001 - older/newer JAX: fall back to StableHLO text
        return lowered.as_text()


def describe_failure(what, key_hex, graph, e) -> str:
    ops = sorted({n.sig.op for n in graph.post if n.data is None})
    wheres = [n.where for n in graph.post if n.where]
    loc = f"; the graph was recorded from {fmt_where(wheres[0])} to {fmt_where(wheres[-1])}" if wheres else ""
    return (f"lazyxla: could not {what} graph {key_hex} ({len(graph.post)} nodes, ops: "
            f"{', '.join(ops[:20])}){loc}: {type(e).__name__}: {e}")
