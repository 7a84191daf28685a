"""Every use of JAX's private internals, in one place.

lazyxla needs six things JAX has no public API for:

1. parameter wrapping (R11): making ``jax.jit`` tuple a program's parameters, which JAX
   decides in ``jax._src.dispatch.should_tuple_args`` (``tupled_parameters``);
2. a loaded executable turned back into a ``jax.stages.Compiled`` (JAX's fast C++ call path
   and its argument checks) for the persistent cache (``compiled_from_executable``), with
   the output shardings of a sharded one (``out_shardings_of``);
3. what a ``Compiled`` keeps of its arguments and closed-over constants, to store it
   (``kept_arguments``, ``has_constant_arguments``);
4. in a job of several processes, JAX's coordination client (``distributed_client``: its
   key-value store, which processes are alive) and whether JAX's runtime already started
   (``backend_started``); and the HLO sharding text of a sharding (``hlo_sharding_text``);
5. JAX's 32-bit defaults with explicit 64-bit dtypes kept, while a program is traced
   (``explicit_x64_allowed``: ``jax_explicit_x64_dtypes`` as a scoped setting; ``widths``);
6. a function traced on abstract values in a trace kept open between calls
   (``trace_abstractly``: what ``jax.eval_shape`` checks, without its set-up per call).

Checked against ``CHECKED_JAX`` (the version pinned in pyproject.toml). When JAX changes
underneath, each function raises ``JaxInternalsChanged`` naming this module and the
missing piece, instead of failing somewhere deep inside a compile; callers that have a
public fallback (the persistent cache's raw executable call) take it.

The private modules are imported where they are used, so that a JAX without them fails
with this module's error at that use, not at ``import lazyxla``.
May touch: JAX's ``should_tuple_args`` (swapped only inside ``tupled_parameters``, under a lock).
"""
from __future__ import annotations

import contextlib
import threading

import jax
import numpy as np

CHECKED_JAX = "0.10.2"


class JaxInternalsChanged(RuntimeError):
    """A private JAX API that lazyxla relies on is not what it was checked against."""


def _changed(what: str, e: Exception) -> JaxInternalsChanged:
    return JaxInternalsChanged(
        f"lazyxla.xla.jax_internals: {what} is not as in JAX {CHECKED_JAX}, which lazyxla was checked against "
        f"(this is JAX {jax.__version__}): {type(e).__name__}: {e}. Install the JAX version pinned in "
        f"lazyxla's pyproject.toml, or update lazyxla/xla/jax_internals.py.")


_WRAP_LOCK = threading.Lock()


@contextlib.contextmanager
def tupled_parameters(on: bool):
    """Within the block, programs that ``jax.jit`` lowers take their parameters as one tuple
    (XLA's parameter_is_tupled_arguments); the runtime still passes a flat argument list."""
    if not on:
        yield
        return
    try:
        from jax._src import dispatch as jax_dispatch
        orig = jax_dispatch.should_tuple_args
    except (ImportError, AttributeError) as e:
        raise _changed("jax._src.dispatch.should_tuple_args", e) from None
    with _WRAP_LOCK:
        jax_dispatch.should_tuple_args = lambda num_args, platform: True
        try:
            yield
        finally:
            jax_dispatch.should_tuple_args = orig


@contextlib.contextmanager
def explicit_x64_allowed():
    """Within the block (and JAX's 32-bit mode), a dtype asked for explicitly keeps its 64 bits
    (``jax_explicit_x64_dtypes`` = ``allow``, set for this thread only)."""
    try:
        from jax._src import config as jax_config
        state, allow = jax_config.explicit_x64_dtypes, jax_config.ExplicitX64Mode.ALLOW
    except (ImportError, AttributeError) as e:
        raise _changed("jax._src.config.explicit_x64_dtypes", e) from None
    with state(allow):
        yield


_ABSTRACT = threading.local()
ABSTRACT_CALLS_PER_TRACE = 256


def trace_abstractly(fn, shapes_dtypes):
    """``fn`` called on abstract arrays of ``shapes_dtypes`` ((shape, JAX dtype) pairs) in a JAX
    trace that stays open between calls (one per thread, replaced every
    ``ABSTRACT_CALLS_PER_TRACE`` calls and after a failure): what ``jax.eval_shape`` checks (a
    function that cannot trace these shapes raises), without eval_shape's set-up of a jitted
    function and a jaxpr on every call (a third of a lowering check's time in a first step,
    where the lowerings' own first traces are the rest)."""
    try:
        from jax._src import core, source_info_util
        from jax._src.interpreters import partial_eval as pe
        st = _ABSTRACT.__dict__
        trace = st.get("trace")
        if trace is None or st["calls"] >= ABSTRACT_CALLS_PER_TRACE:
            trace = st["trace"] = pe.DynamicJaxprTrace(None, parent_trace=core.trace_ctx.trace)
            st["calls"] = 0
        st["calls"] += 1
        src = source_info_util.current()
        args = [trace.new_arg(core.ShapedArray(shape, dtype), src) for shape, dtype in shapes_dtypes]
        enter = core.set_current_trace(trace)
    except (ImportError, AttributeError, TypeError) as e:
        raise _changed("jax._src.interpreters.partial_eval.DynamicJaxprTrace", e) from None
    try:
        with enter:
            return fn(*args)
    except BaseException:
        st["trace"] = None  # its frame may hold a half-traced call
        raise


def hlo_sharding_text(sharding, ndim: int) -> str:
    """XLA's HLO sharding text of a JAX sharding for an array of ``ndim`` dimensions
    (``{devices=[8,1]<=[8]}``, ``{replicated}``)."""
    try:
        return str(sharding._to_xla_hlo_sharding(ndim))
    except AttributeError as e:
        raise _changed("jax.sharding.Sharding._to_xla_hlo_sharding", e) from None


def kept_arguments(compiled, n_args: int) -> list:
    """The indices of the arguments a ``jax.stages.Compiled`` passes to its executable
    (JAX drops unused ones)."""
    try:
        kept = compiled._executable._kept_var_idx
    except AttributeError as e:
        raise _changed("jax.stages.Compiled._executable._kept_var_idx", e) from None
    return sorted(kept) if kept is not None else list(range(n_args))


def has_constant_arguments(compiled) -> bool:
    """Whether a ``Compiled`` passes closed-over constants as extra arguments."""
    params = getattr(compiled, "_params", None)
    return bool(params is not None and getattr(params, "const_args", None))


def out_shardings_of(executable, devices) -> list:
    """The output shardings a loaded multi-device executable was compiled with, as JAX
    shardings over ``devices`` (in the executable's device order)."""
    try:
        from jax._src.interpreters import pxla
        from jax._src.lib import xla_client as xc
        n_out = len(executable.get_output_layouts())
        shardings = pxla.get_out_shardings_from_executable(executable, xc.DeviceList(tuple(devices)), n_out, 0)
    except (ImportError, AttributeError, TypeError) as e:
        raise _changed("jax._src.interpreters.pxla.get_out_shardings_from_executable", e) from None
    if shardings is None or len(shardings) != n_out:
        raise _changed("jax._src.interpreters.pxla.get_out_shardings_from_executable",
                       ValueError(f"no output shardings for {n_out} outputs"))
    return list(shardings)


def compiled_from_executable(executable, devices, name, arg_specs, out_specs, kept, donated,
                             in_shardings=None, out_shardings=None):
    """A ``jax.stages.Compiled`` around a deserialized executable, built the way JAX builds
    one after compiling. ``devices``: the executable's devices, in its order (one, or the
    mesh's); ``arg_specs``/``out_specs``: (shape, numpy dtype) pairs; ``kept``: the argument
    indices the executable takes; ``donated``: donated indices; ``in_shardings`` (one per
    argument) and ``out_shardings``: JAX shardings, needed when there are several devices."""
    try:
        from jax._src import core, stages, tree_util
        from jax._src.interpreters import pxla
        from jax._src.layout import Layout
        from jax._src.lib import xla_client as xc
        from jax.sharding import SingleDeviceSharding

        in_avals = [core.ShapedArray(tuple(shape), np.dtype(dt)) for shape, dt in arg_specs]
        out_avals = [core.ShapedArray(tuple(shape), np.dtype(dt)) for shape, dt in out_specs]
        kin = [in_avals[i] for i in kept]
        if len(devices) == 1:
            sh = SingleDeviceSharding(devices[0])
            in_sh, out_sh = [sh] * len(kin), [sh] * len(out_avals)
        else:
            in_sh, out_sh = [in_shardings[i] for i in kept], list(out_shardings)
        xla_in = [Layout.from_pjrt_layout(x) for x in executable.get_parameter_layouts()]
        xla_out = [Layout.from_pjrt_layout(x) for x in executable.get_output_layouts()]
        unloaded = pxla.UnloadedMeshExecutable(
            xla_executable=executable, device_list=xc.DeviceList(tuple(devices)), backend=devices[0].client,
            input_avals=kin, input_shardings=in_sh, output_avals=out_avals,
            output_shardings=out_sh, committed=len(devices) > 1, name=name,
            unordered_effects=[], ordered_effects=[], keepalive=[], host_callbacks=[],
            kept_var_idx=set(kept), mut=None, xla_in_layouts=xla_in,
            dispatch_in_layouts=pxla.get_dispatch_layouts(xla_in, in_sh, kin),
            xla_out_layouts=xla_out, all_args_info=None, pgle_profiler=None)
        args_info = (tuple(stages.ArgInfo(a, i in donated) for i, a in enumerate(in_avals)), {})
        out_tree = tree_util.tree_structure(tuple(range(len(out_avals))))
        return stages.Compiled(unloaded.load(), [], args_info, out_tree, no_kwargs=True)
    except (ImportError, AttributeError, TypeError) as e:
        raise _changed("building a jax.stages.Compiled from a loaded executable", e) from None


def distributed_client():
    """JAX's coordination-service client of this process's job (after jax.distributed.initialize)."""
    try:
        from jax._src import distributed
        client = distributed.global_state.client
    except (ImportError, AttributeError) as e:
        raise _changed("jax._src.distributed.global_state.client", e) from None
    if client is None:
        raise _changed("jax._src.distributed.global_state.client", ValueError("no client after initialize"))
    return client


def backend_started() -> bool:
    """Whether JAX's runtime has started in this process (jax.distributed must come first)."""
    try:
        from jax._src import xla_bridge
        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):  # JAX moved it: jax.distributed.initialize says so itself
        return False
