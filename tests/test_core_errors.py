"""Bad input and CPU fallbacks (R1.2, R1.7 in docs/design.md).

User errors are raised where the user recorded the op, naming the op, the shapes or devices
and the user's file:line. Ops with no lowering run on the CPU and are counted as aten::<op>.
"""
from __future__ import annotations

import gc
import inspect
import itertools
import os
import re

import pytest
import torch

import lazyxla
from lazyhelp import cnt
import lazyxla.debug.metrics as met

DEV = lazyxla.device()

pytestmark = pytest.mark.usefixtures("nothing_pending")
HERE = os.path.basename(__file__)
_sizes = itertools.count(6101)


def fresh() -> int:
    return next(_sizes)


def assert_names_line(msg, line):
    assert re.search(rf"{re.escape(HERE)}(:|\", line ){line}\b", msg), \
        f"expected {HERE}:{line} in the message: {msg!r}"


# ---------------------------------------------------------------------------------------
# Mixing devices.
def test_lazy_plus_cpu_tensor_names_both_devices_and_the_user_line():
    x = torch.ones(2, 3).to(DEV)
    c = torch.ones(2, 3)
    with pytest.raises(RuntimeError) as ei:
        line = inspect.currentframe().f_lineno; x + c  # noqa: E702
    msg = str(ei.value)
    assert "lazyxla" in msg
    assert "cpu" in msg
    assert_names_line(msg, line)


def test_cpu_tensor_in_other_position_also_raises():
    x = torch.ones(4).to(DEV)
    c = torch.arange(4.0)
    with pytest.raises(RuntimeError) as ei:
        line = inspect.currentframe().f_lineno; torch.mul(c, x)  # noqa: E702
    msg = str(ei.value)
    assert "lazyxla" in msg and "cpu" in msg
    assert_names_line(msg, line)


def test_device_mismatch_leaves_nothing_behind():
    n = fresh()
    h = torch.randn(n)
    x = h.to(DEV)
    with pytest.raises(RuntimeError):
        x + torch.ones(n)
    y = x * 2
    lazyxla.sync()
    torch.testing.assert_close(y.cpu(), h * 2)


def test_zero_dim_cpu_tensor_mixes_in():
    h = torch.randn(5)
    x = h.to(DEV)
    s = torch.tensor(2.5)
    a = x + s
    b = s * x
    c = x / torch.tensor(4.0, dtype=torch.float64)  # a 0-dim tensor does not promote a dim>0 one
    assert a.device == DEV and b.device == DEV and c.device == DEV
    assert c.dtype == (h / torch.tensor(4.0, dtype=torch.float64)).dtype
    lazyxla.sync()
    torch.testing.assert_close(a.cpu(), h + 2.5)
    torch.testing.assert_close(b.cpu(), 2.5 * h)
    torch.testing.assert_close(c.cpu(), h / torch.tensor(4.0, dtype=torch.float64))


def test_zero_dim_cpu_tensor_is_captured_by_value():
    # Eager semantics: changing the CPU scalar tensor after the op does not change the result.
    h = torch.randn(5)
    x = h.to(DEV)
    s = torch.tensor(2.0)
    y = x * s
    s.fill_(100.0)
    lazyxla.sync()
    torch.testing.assert_close(y.cpu(), h * 2.0)


def test_copy_from_cpu_tensor_is_captured_by_value():
    h = torch.randn(6)
    x = torch.zeros(6).to(DEV)
    x.copy_(h)
    want = h.clone()
    h.fill_(-3.0)
    lazyxla.sync()
    torch.testing.assert_close(x.cpu(), want)


# ---------------------------------------------------------------------------------------
# Shape errors at the recording line.
def test_mm_shape_mismatch_raises_at_recording_line():
    a = torch.ones(2, 3).to(DEV)
    b = torch.ones(4, 5).to(DEV)
    u = cnt("UncachedCompile") + cnt("CachedCompile")
    with pytest.raises(RuntimeError) as ei:
        line = inspect.currentframe().f_lineno; torch.mm(a, b)  # noqa: E702
    msg = str(ei.value)
    assert "mm" in msg
    assert re.search(r"2(, ?| ?x ?)3", msg), msg
    assert re.search(r"4(, ?| ?x ?)5", msg), msg
    assert_names_line(msg, line)
    # Raised while recording: nothing was compiled or looked up.
    assert cnt("UncachedCompile") + cnt("CachedCompile") == u
    # The same mistake again reports its own (new) line.
    with pytest.raises(RuntimeError) as ei2:
        line2 = inspect.currentframe().f_lineno; a @ b  # noqa: E702
    assert line2 != line
    assert_names_line(str(ei2.value), line2)
    # And the device still works.
    c = torch.mm(a, torch.ones(3, 5).to(DEV))
    lazyxla.sync()
    torch.testing.assert_close(c.cpu(), torch.full((2, 5), 3.0))


def test_broadcast_mismatch_raises_at_recording_line():
    a = torch.ones(3).to(DEV)
    b = torch.ones(4).to(DEV)
    with pytest.raises(RuntimeError) as ei:
        line = inspect.currentframe().f_lineno; a + b  # noqa: E702
    msg = str(ei.value)
    assert "add" in msg
    assert_names_line(msg, line)


def test_pending_shape_error_does_not_wait_for_sync():
    # The op on a pending (never-synced) tensor fails at once, not at the next sync.
    x = torch.ones(2, 3, device=DEV) * 2
    with pytest.raises(RuntimeError):
        x.view(4, 2)
    lazyxla.sync()
    torch.testing.assert_close(x.cpu(), torch.full((2, 3), 2.0))


# ---------------------------------------------------------------------------------------
# CPU fallback (R1.7).
def test_fallback_nonzero_gives_eager_result_and_counts():
    h = torch.tensor([0.0, 1.5, 0.0, -2.0, 3.0, 0.0])
    x = h.to(DEV)
    pending = x * 2  # the input is pending IR: the fallback reads it
    c0 = cnt("aten::nonzero")
    nz = torch.nonzero(pending)
    assert cnt("aten::nonzero") - c0 == 1
    assert nz.device == DEV
    assert nz.dtype == torch.int64
    assert torch.equal(nz.cpu(), torch.nonzero(h * 2))
    # The result is an ordinary lazy tensor: it takes part in later ops.
    y = nz.sum() + 1
    lazyxla.sync()
    assert y.item() == torch.nonzero(h * 2).sum().item() + 1


@pytest.mark.parametrize("name, fn", [
    ("allclose", lambda a, b: torch.allclose(a, b)),
    ("allclose", lambda a, b: torch.allclose(a, a + 1e-9)),
    ("equal", lambda a, b: torch.equal(a, b)),
    ("equal", lambda a, b: torch.equal(a, a * 1)),
], ids=["allclose-differ", "allclose-close", "equal-differ", "equal-same"])
def test_ops_returning_a_python_value_read_their_inputs(name, fn):
    # their meta kernels cannot answer (allclose calls .item()): never a cached constant
    h = torch.randn(fresh())
    a, b = h.to(DEV), (h + 1).to(DEV)
    c0 = cnt(f"aten::{name}")
    assert fn(a, b) == fn(h, h + 1)
    assert cnt(f"aten::{name}") - c0 == 1


_lib = torch.library.Library("lazyxla_errtest", "DEF")
_lib.define("bump_(Tensor(a!) x, Tensor(b!) counter) -> ()")


def _bump_cpu(x, counter):
    x.add_(1)
    counter.add_(x.sum())


_lib.impl("bump_", _bump_cpu, "CPU")
_lib.impl("bump_", lambda x, counter: None, "Meta")


def test_op_writing_its_arguments_without_lowering_runs_on_the_cpu_and_writes_back():
    # an op that returns nothing but writes its arguments is never mistaken for a constant
    x, c = torch.zeros(3, device=DEV), torch.zeros((), device=DEV)
    c0 = cnt("aten::bump_")
    torch.ops.lazyxla_errtest.bump_(x, c)
    torch.ops.lazyxla_errtest.bump_(x, c)
    assert x.cpu().tolist() == [2.0, 2.0, 2.0] and c.item() == 9.0
    assert cnt("aten::bump_") - c0 == 2


def test_decomposition_that_declines_falls_back():
    # PyTorch's decomposition of adaptive_max_pool2d returns NotImplemented for windows of
    # unequal sizes: the op then runs on the CPU (it raised a TypeError from the dispatcher)
    x = torch.randn(1, 2, 5, 7, requires_grad=True)
    lx = x.detach().to(DEV).requires_grad_()
    c0 = cnt("aten::adaptive_max_pool2d")
    y, ly = torch.nn.functional.adaptive_max_pool2d(x, (2, 3)), torch.nn.functional.adaptive_max_pool2d(lx, (2, 3))
    y.sum().backward()
    ly.sum().backward()
    from lazyxla import lowering
    lowered = torch.ops.aten.adaptive_max_pool2d.default in lowering.LOWERINGS  # once lowered, nothing declines
    assert cnt("aten::adaptive_max_pool2d") - c0 == (0 if lowered else 1)
    torch.testing.assert_close(ly.cpu(), y.detach())
    torch.testing.assert_close(lx.grad.cpu(), x.grad)


def test_packed_sequences_are_refused_with_a_clear_message():
    x = torch.randn(3, 5, 2).to(DEV)
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(lazyxla.LazyXlaError, match="does not support packed sequences") as ei:
        torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor([5, 3, 2]), batch_first=True)
    assert f"{HERE}:{line}" in str(ei.value)


def test_fallback_tuple_result():
    # an op without a lowering that returns two tensors runs on the CPU; both come back on the device
    @torch.library.custom_op("lazyxla_test::sum_and_prod", mutates_args=())
    def sum_and_prod(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.sum(0), x.prod(0)

    sum_and_prod.register_fake(lambda x: (x.new_empty(x.shape[1:]), x.new_empty(x.shape[1:])))
    g = torch.Generator().manual_seed(3)
    h = torch.randn(5, 4, generator=g)
    c0 = cnt("aten::sum_and_prod")
    a, b = sum_and_prod(h.to(DEV))
    assert cnt("aten::sum_and_prod") - c0 == 1
    assert a.device == DEV and b.device == DEV
    torch.testing.assert_close(a.cpu(), h.sum(0))
    torch.testing.assert_close(b.cpu(), h.prod(0))


def test_fallback_counter_visible_in_short_report():
    x = torch.tensor([1.0, 2.0, 2.0, 5.0]).to(DEV)
    r = torch.unique(x)  # its output shape depends on the values: the CPU computes it
    torch.testing.assert_close(r.cpu(), torch.unique(torch.tensor([1.0, 2.0, 2.0, 5.0])))
    assert met.counter_value("aten::_unique2") >= 1
    assert "Counter: aten::_unique2\n" in met.short_metrics_report()


def test_a_lowering_that_cannot_trace_its_inputs_fails_at_the_op_naming_it(monkeypatch):
    """A signature's lowering is traced on abstract inputs when it is first seen (in a JAX trace
    kept open between checks, ``jax_internals.trace_abstractly``): one that cannot trace them
    fails at the op, at the user's line; the trace it broke is replaced and the next op checks."""
    from lazyxla.errors import LazyXlaError
    from lazyxla.frontend import signature, tensor
    real_get = signature.lowering.get

    def broken(sig, a, b):
        raise ValueError("no lowering for these shapes")
    monkeypatch.setattr(signature.lowering, "get", lambda func, *a, **k:
                        broken if func is torch.ops.aten.atan2.default else real_get(func, *a, **k))
    monkeypatch.setattr(tensor, "_SIGS", {})  # every signature first seen again
    x = torch.linspace(-1, 1, 6).reshape(2, 3)
    t = x.to(lazyxla.device())
    with pytest.raises(LazyXlaError, match=r"atan2\(.*\) is not supported by lazyxla: ValueError: no lowering "
                                           r"for these shapes at .*test_core_errors\.py:\d+"):
        torch.atan2(t, t + 1)
    torch.testing.assert_close(torch.hypot(t, t * 2).cpu(), torch.hypot(x, x * 2))


def test_the_abstract_check_falls_back_to_eval_shape_when_jax_internals_changed(monkeypatch):
    import jax
    from jax._src.interpreters import partial_eval as pe
    from lazyxla.frontend import signature, tensor
    from lazyxla.xla import jax_internals
    with monkeypatch.context() as m:   # what a JAX without the trace lazyxla keeps open says
        m.delattr(pe, "DynamicJaxprTrace")
        m.setattr(jax_internals._ABSTRACT, "trace", None, raising=False)
        with pytest.raises(jax_internals.JaxInternalsChanged, match="DynamicJaxprTrace"):
            jax_internals.trace_abstractly(lambda v: v, [((2,), "float32")])

    def changed(fn, shapes_dtypes):
        raise jax_internals.JaxInternalsChanged("changed")
    shaped = []
    eval_shape = jax.eval_shape
    monkeypatch.setattr(jax_internals, "trace_abstractly", changed)
    monkeypatch.setattr(signature.jax, "eval_shape", lambda *a, **k: shaped.append(1) or eval_shape(*a, **k))
    monkeypatch.setattr(tensor, "_SIGS", {})
    x = torch.linspace(-1, 1, 6).reshape(2, 3)
    torch.testing.assert_close(torch.atan2(x.to(DEV), x.to(DEV) + 2).cpu(), torch.atan2(x, x + 2))
    assert shaped
