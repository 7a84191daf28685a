"""Numerics of the nn lowerings (lazyxla/lowering/: conv, pooling, resample, softmax, loss, layer_norm, embedding, activation) against PyTorch eager CPU.

Each case runs the ATen op on meta tensors for the output metas, traces the registered
lowering into one program as the compiler does (``call_lowering``) on JAX copies of the
inputs (scalars passed as the dispatcher passes them), casts like the executor does, and
compares with the eager CPU result. The last tests go through
the real lazy device end to end.
"""
from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

import lazyxla  # noqa: F401  (enables JAX 64-bit mode)
from lazyxla.compiler.compile import options_for
from lazyxla.lowering import LOWERINGS
from lazyxla.xla import precision, widths
from lazyxla.xla.client import jnp_dtype

aten = torch.ops.aten

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-10),
       torch.bfloat16: dict(rtol=2e-2, atol=2e-2), torch.float16: dict(rtol=2e-3, atol=2e-3)}


# ---------------------------------------------------------------------------------------
# Harness.
def _to_jax(t):
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return jnp.asarray(t.view(torch.int16).numpy().view(ml_dtypes.bfloat16))
    return jnp.asarray(t.numpy())


def _to_torch(a, dtype):
    a = np.asarray(a)
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.astype(np.float32)).to(dtype)
    return torch.from_numpy(np.array(a)).to(dtype)


def _map(fn, x):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map(fn, y) for y in x)
    return x


def _scalar_dtype(args):
    fl = [a.dtype for a in args if isinstance(a, torch.Tensor) and a.dtype.is_floating_point]
    if not fl:
        return jnp.float32
    return jnp.float64 if fl[0] == torch.float64 else jnp.float32


def _jax_args(op, args, kwargs):
    """Tensors -> JAX arrays; non-special Scalar arguments -> 0-d arrays (the warm path's rule)."""
    schema = op._schema.arguments
    sdt = _scalar_dtype(list(args) + list(kwargs.values()))

    def conv(a, arg):
        if isinstance(a, torch.Tensor):
            return _to_jax(a)
        if str(arg.type).startswith("Scalar") and type(a) in (int, float) and a not in (0, 1, -1):
            return jnp.asarray(a, sdt if isinstance(a, float) else jnp.int64)
        return _map(_to_jax, a)

    jargs = [conv(a, schema[i]) for i, a in enumerate(args)]
    by_name = {a.name: a for a in schema}
    jkw = {k: conv(v, by_name[k]) for k, v in kwargs.items()}
    return jargs, jkw


def call_lowering(fn, sig, *args, op=None, **kwargs):
    """``fn(sig, *args, **kwargs)`` as the compiler calls a lowering: traced once into one
    program (the arrays its arguments, the rest fixed) under the matmul precision's scope, and
    compiled with the XLA options the compiler gives a program of that one op (``op``, an ATen
    overload; ``compiler.OPTION_RULES``). Called op by op outside that scope, a float32 product
    would compute at JAX's default (one bfloat16 pass on a TPU) and each JAX op would be a
    program of its own."""
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
    where = [isinstance(x, jax.Array) for x in leaves]

    def traced(*arrays):
        it = iter(arrays)
        a, kw = jax.tree_util.tree_unflatten(tree, [next(it) if w else x for x, w in zip(leaves, where)])
        return fn(sig, *a, **kw)

    arrays = [x for x, w in zip(leaves, where) if w]
    held = {op._schema.name} if op is not None else set()
    with precision.scope():
        return jax.jit(traced).lower(*arrays).compile(options_for(held, False, 1) or None)(*arrays)


def run_lowering(op, *args, **kwargs):
    """The lowering's outputs as torch tensors (cast to the meta dtypes), one per meta output."""
    margs = _map(lambda t: t.to("meta"), list(args))
    mkw = {k: _map(lambda t: t.to("meta"), v) for k, v in kwargs.items()}
    mout = op(*margs, **mkw)
    metas = [mout] if isinstance(mout, torch.Tensor) else [m for m in mout if m is not None]
    sig = types.SimpleNamespace(
        outs=tuple(types.SimpleNamespace(shape=tuple(m.shape), dtype=m.dtype) for m in metas),
        cdtype=None)
    jargs, jkw = _jax_args(op, args, kwargs)

    def cast(sig, *a, **kw):  # in the same program: one compile per case
        res = LOWERINGS[op](sig, *a, **kw)
        if not isinstance(res, (tuple, list)):
            res = (res,)
        assert len(res) == len(metas), (len(res), len(metas))
        return tuple(jnp.asarray(r).astype(jnp_dtype(m.dtype)) for r, m in zip(res, metas))

    out = []
    for r, m in zip(call_lowering(cast, sig, *jargs, op=op, **jkw), metas):
        assert tuple(r.shape) == tuple(m.shape), (r.shape, m.shape)
        out.append(_to_torch(r, m.dtype))
    return out


def check(op, *args, tol=None, meta_dtype_differs=False, **kwargs):
    """Compare the lowering with eager CPU on every output PyTorch's meta produces.

    ``meta_dtype_differs``: PyTorch's meta kernel gives some output another dtype than eager
    CPU does (the lowering follows the meta); compare those values in the meta dtype.
    Where float64 is emulated (a TPU), a float64 case is not run (None): there each float64
    program compiles for seconds, and float64 is checked by test_beyond_float32.py
    (conftest's ``FLOAT64_FILES``)."""
    held = []
    _map(held.append, [list(args), list(kwargs.values())])
    if not widths.float64_native() and any(t.dtype == torch.float64 for t in held):
        return None
    got = run_lowering(op, *args, **kwargs)
    exp = op(*args, **kwargs)
    exp = [exp] if isinstance(exp, torch.Tensor) else list(exp)
    margs = _map(lambda t: t.to("meta"), list(args))
    mkw = {k: _map(lambda t: t.to("meta"), v) for k, v in kwargs.items()}
    mout = op(*margs, **mkw)
    present = [True] if isinstance(mout, torch.Tensor) else [m is not None for m in mout]
    exp = [e for e, p in zip(exp, present) if p]
    assert len(got) == len(exp)
    for g, e in zip(got, exp):
        t = tol or TOL.get(e.dtype, dict(rtol=0, atol=0))
        if meta_dtype_differs and g.dtype != e.dtype:
            e = e.to(g.dtype)
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g, e, equal_nan=True, **t)
    return got


def rnd(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype)


# ---------------------------------------------------------------------------------------
# Convolution.
CONV_CASES = [
    # (input shape, weight shape, stride, padding, dilation, transposed, output_padding, groups)
    ((2, 3, 9, 9), (4, 3, 3, 3), [1, 1], [0, 0], [1, 1], False, [0, 0], 1),
    ((2, 4, 10, 11), (6, 2, 3, 2), [2, 1], [1, 2], [2, 1], False, [0, 0], 2),
    ((1, 6, 8, 8), (6, 1, 3, 3), [2, 2], [1, 1], [1, 1], False, [0, 0], 6),
    ((2, 3, 17), (5, 3, 4), [3], [2], [2], False, [0], 1),
    ((1, 2, 5, 6, 7), (4, 2, 2, 3, 2), [1, 2, 1], [1, 0, 1], [1, 1, 2], False, [0, 0, 0], 1),
    ((2, 3, 5, 5), (3, 4, 3, 3), [2, 2], [1, 1], [1, 1], True, [1, 1], 1),
    ((2, 4, 4, 5), (4, 3, 3, 2), [2, 3], [0, 1], [2, 1], True, [1, 2], 2),
    ((1, 2, 7), (2, 3, 5), [1], [3], [1], True, [0], 1),
    ((1, 3, 4, 4), (3, 2, 1, 1), [1, 1], [0, 0], [1, 1], True, [0, 0], 1),
    # many channels on a small map: a dot over patches (conv._PATCHES)
    ((2, 128, 3, 3), (8, 128, 3, 3), [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
    ((2, 120, 5, 6), (4, 120, 3, 3), [2, 1], [1, 0], [1, 1], False, [0, 0], 1),
    ((1, 128, 1, 1), (3, 128, 3, 3), [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
    ((2, 5, 6, 6), (7, 5, 1, 1), [2, 2], [0, 0], [1, 1], False, [0, 0], 1),
]


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_convolution(case, bias):
    xs, ws, st, pd, dl, tr, op, g = case
    x, w = rnd(*xs, seed=1), rnd(*ws, seed=2)
    cout = ws[1] * g if tr else ws[0]
    b = rnd(cout, seed=3) if bias else None
    check(aten.convolution.default, x, w, b, st, pd, dl, tr, op, g)


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("mask", [[True, True, True], [False, True, True], [True, False, False]])
def test_convolution_backward(case, mask):
    xs, ws, st, pd, dl, tr, op, g = case
    x, w = rnd(*xs, seed=1), rnd(*ws, seed=2)
    y = aten.convolution.default(x, w, None, st, pd, dl, tr, op, g)
    gy = rnd(*y.shape, seed=4)
    cout = y.shape[1]
    check(aten.convolution_backward.default, gy, x, w, [cout], st, pd, dl, tr, op, g, mask,
          tol=dict(rtol=1e-5, atol=5e-5))


def test_convolution_double_and_bf16():
    x, w, b = rnd(2, 3, 8, 8, seed=1), rnd(4, 3, 3, 3, seed=2), rnd(4, seed=3)
    args = ([2, 2], [1, 1], [1, 1], False, [0, 0], 1)
    check(aten.convolution.default, x.double(), w.double(), b.double(), *args)
    check(aten.convolution.default, x.bfloat16(), w.bfloat16(), b.bfloat16(), *args,
          tol=dict(rtol=2e-2, atol=5e-2))


def test_convolution_backward_masked_slots_are_zeros():
    """When sig.outs keeps a slot for a masked-off output, it is filled with zeros."""
    x, w = rnd(1, 2, 5, 5, seed=1), rnd(3, 2, 3, 3, seed=2)
    gy = rnd(1, 3, 3, 3, seed=3)
    outs = tuple(types.SimpleNamespace(shape=s, dtype=torch.float32)
                 for s in [(1, 2, 5, 5), (3, 2, 3, 3), (3,)])
    sig = types.SimpleNamespace(outs=outs, cdtype=torch.float32)
    res = call_lowering(
        LOWERINGS[aten.convolution_backward.default], sig, _to_jax(gy), _to_jax(x), _to_jax(w), [3],
        [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [False, True, False], op=aten.convolution_backward.default)
    assert [tuple(r.shape) for r in res] == [(1, 2, 5, 5), (3, 2, 3, 3), (3,)]
    assert float(jnp.abs(res[0]).max()) == 0.0 and float(jnp.abs(res[2]).max()) == 0.0
    exp = aten.convolution_backward.default(gy, x, w, [3], [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                            [False, True, False])[1]
    torch.testing.assert_close(_to_torch(res[1], torch.float32), exp, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------
# Pooling.
POOL_CASES = [
    # (input shape, kernel, stride, padding, dilation, ceil_mode)
    ((2, 3, 8, 8), [2, 2], [2, 2], [0, 0], [1, 1], False),
    ((2, 3, 9, 9), [3, 3], [2, 2], [1, 1], [1, 1], False),
    ((2, 3, 9, 10), [3, 2], [2, 2], [1, 1], [1, 1], True),
    ((1, 2, 10, 9), [3, 3], [], [1, 0], [1, 1], True),
    ((1, 2, 11, 11), [3, 3], [2, 1], [1, 1], [2, 2], False),
    ((3, 7, 7), [2, 3], [3, 2], [1, 1], [1, 2], True),
    ((1, 1, 5, 5), [5, 5], [1, 1], [2, 2], [1, 1], False),
]


@pytest.mark.parametrize("case", POOL_CASES)
def test_max_pool2d_with_indices(case):
    xs, k, s, p, d, c = case
    check(aten.max_pool2d_with_indices.default, rnd(*xs, seed=5), k, s, p, d, c)


def test_max_pool2d_ties_inf_nan():
    x = torch.tensor([[[[1., 1., 2., 2.],
                        [1., 1., 2., 2.],
                        [-float("inf"), -float("inf"), float("nan"), 0.],
                        [-float("inf"), -float("inf"), 3., float("nan")]]]])
    got = check(aten.max_pool2d_with_indices.default, x, [2, 2], [2, 2], [1, 1], [1, 1], True)
    eager_idx = aten.max_pool2d_with_indices.default(x, [2, 2], [2, 2], [1, 1], [1, 1], True)[1]
    assert torch.equal(got[1], eager_idx)
    check(aten.max_pool2d_with_indices.default, x, [2, 2], [2, 2], [0, 0], [1, 1], False)
    check(aten.max_pool2d_with_indices.default, x.double(), [3, 3], [1, 1], [1, 1], [1, 1], False)


@pytest.mark.parametrize("case", POOL_CASES)
def test_max_pool2d_with_indices_backward(case):
    xs, k, s, p, d, c = case
    x = rnd(*xs, seed=5)
    out, idx = aten.max_pool2d_with_indices.default(x, k, s, p, d, c)
    g = rnd(*out.shape, seed=6)
    check(aten.max_pool2d_with_indices_backward.default, g, x, k, s or k, p, d, c, idx)


AVG_CASES = [
    # (input shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    ((2, 3, 8, 8), [2, 2], [2, 2], [0, 0], False, True, None),
    ((2, 3, 9, 9), [3, 3], [2, 2], [1, 1], False, True, None),
    ((2, 3, 9, 9), [3, 3], [2, 2], [1, 1], False, False, None),
    ((2, 3, 10, 9), [3, 2], [2, 2], [1, 1], True, True, None),
    ((2, 3, 10, 9), [3, 2], [2, 2], [1, 1], True, False, None),
    ((1, 2, 7, 6), [3, 3], [], [1, 0], True, False, None),
    ((3, 7, 7), [2, 3], [3, 2], [1, 1], False, True, 5),
    ((1, 1, 6, 6), [4, 4], [3, 3], [2, 2], True, True, 3),
]


@pytest.mark.parametrize("case", AVG_CASES)
def test_avg_pool2d(case):
    xs, k, s, p, c, cip, div = case
    check(aten.avg_pool2d.default, rnd(*xs, seed=7), k, s, p, c, cip, div)


@pytest.mark.parametrize("case", AVG_CASES)
def test_avg_pool2d_backward(case):
    xs, k, s, p, c, cip, div = case
    x = rnd(*xs, seed=7)
    out = aten.avg_pool2d.default(x, k, s, p, c, cip, div)
    g = rnd(*out.shape, seed=8)
    check(aten.avg_pool2d_backward.default, g, x, k, s or k, p, c, cip, div)


def test_pool_defaults_omitted_and_bf16():
    x = rnd(2, 3, 8, 8, seed=9)
    check(aten.avg_pool2d.default, x, [2, 2])
    check(aten.max_pool2d_with_indices.default, x, [3, 3])
    check(aten.avg_pool2d.default, x.bfloat16(), [3, 3], [2, 2], [1, 1])
    check(aten.max_pool2d_with_indices.default, x.bfloat16(), [3, 3], [2, 2], [1, 1])


@pytest.mark.parametrize("shape,out", [((2, 3, 8, 8), [4, 4]), ((2, 3, 7, 9), [3, 4]),
                                       ((3, 5, 5), [1, 1]), ((1, 2, 4, 6), [7, 5]),
                                       ((1, 2, 10, 10), [10, 3])])
def test_adaptive_avg_pool2d(shape, out):
    x = rnd(*shape, seed=10)
    y = check(aten._adaptive_avg_pool2d.default, x, out)[0]
    g = rnd(*y.shape, seed=11)
    check(aten._adaptive_avg_pool2d_backward.default, g, x)
    check(aten._adaptive_avg_pool2d.default, x.double(), out)


# ---------------------------------------------------------------------------------------
# Softmax.
@pytest.mark.parametrize("shape,dim", [((4, 7), 1), ((4, 7), 0), ((2, 3, 5), -1), ((2, 3, 5), 1),
                                       ((6,), 0), ((), 0)])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_and_backward(shape, dim, log):
    fwd = aten._log_softmax.default if log else aten._softmax.default
    bwd = aten._log_softmax_backward_data.default if log else aten._softmax_backward_data.default
    x = rnd(*shape, seed=12) * 5
    out = check(fwd, x, dim, False)[0]
    g = rnd(*shape, seed=13)
    check(bwd, g, fwd(x, dim, False), dim, torch.float32)
    check(fwd, x.double(), dim, False)
    assert out.shape == x.shape


def test_softmax_half_to_float_and_bf16():
    x = rnd(3, 8, seed=14, dtype=torch.bfloat16)
    check(aten._softmax.default, x, 1, False)
    check(aten._log_softmax.default, x, 1, False)
    # half_to_float is only supported by eager CPU for the CUDA path; check the float output
    got = run_lowering(aten._softmax.default, x, 1, True)[0]
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, torch.softmax(x.float(), 1), rtol=1e-5, atol=1e-6)
    y = aten._softmax.default(x, 1, False)
    check(aten._softmax_backward_data.default, rnd(3, 8, seed=15, dtype=torch.bfloat16), y, 1,
          torch.bfloat16)


def test_softmax_extreme_values():
    x = torch.tensor([[1000., 0., -1000.], [-float("inf"), 0., 1.], [3., 3., 3.]])
    check(aten._softmax.default, x, 1, False)
    check(aten._log_softmax.default, x, 1, False)


# ---------------------------------------------------------------------------------------
# Losses.
@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("use_weight", [False, True])
@pytest.mark.parametrize("ignore_index", [-100, 2])
@pytest.mark.parametrize("shape", [(6, 5), (5,)])
def test_nll_loss(reduction, use_weight, ignore_index, shape):
    x = torch.log_softmax(rnd(*shape, seed=16), -1)
    C = shape[-1]
    t = torch.tensor([0, 2, 4, 2, 1, 3])[: shape[0]] if len(shape) == 2 else torch.tensor(2)
    w = torch.rand(C, generator=torch.Generator().manual_seed(3)) if use_weight else None
    out, total = check(aten.nll_loss_forward.default, x, t, w, reduction, ignore_index)
    g = rnd(*out.shape, seed=17)
    check(aten.nll_loss_backward.default, g, x, t, w, reduction, ignore_index, total)


@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("use_weight", [False, True])
@pytest.mark.parametrize("ignore_index", [-100, 1])
def test_nll_loss2d(reduction, use_weight, ignore_index):
    x = torch.log_softmax(rnd(2, 4, 3, 5, seed=18), 1)
    t = torch.randint(0, 4, (2, 3, 5), generator=torch.Generator().manual_seed(4))
    w = torch.rand(4, generator=torch.Generator().manual_seed(5)) if use_weight else None
    out, total = check(aten.nll_loss2d_forward.default, x, t, w, reduction, ignore_index)
    g = rnd(*out.shape, seed=19)
    check(aten.nll_loss2d_backward.default, g, x, t, w, reduction, ignore_index, total)


def test_nll_loss_all_ignored_is_nan_for_mean():
    x = torch.log_softmax(rnd(3, 4, seed=20), -1)
    t = torch.tensor([-100, -100, -100])
    out, total = check(aten.nll_loss_forward.default, x, t, None, 1, -100)
    assert torch.isnan(out) and total.item() == 0.0


def _loss_inputs(shape, kind):
    if kind == "bce":
        x = torch.rand(*shape, generator=torch.Generator().manual_seed(21)) * 0.98 + 0.01
        t = torch.rand(*shape, generator=torch.Generator().manual_seed(22))
        return x, t
    return rnd(*shape, seed=21) * 2, rnd(*shape, seed=22) * 2


@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("shape", [(4, 5), (3, 2, 4), ()])
def test_mse_loss(reduction, shape):
    x, t = _loss_inputs(shape, "mse")
    out = check(aten.mse_loss.default, x, t, reduction)[0]
    check(aten.mse_loss_backward.default, rnd(*out.shape, seed=23), x, t, reduction)


@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("use_weight", [False, True])
def test_binary_cross_entropy(reduction, use_weight):
    x, t = _loss_inputs((4, 6), "bce")
    w = torch.rand(4, 6, generator=torch.Generator().manual_seed(24)) if use_weight else None
    out = check(aten.binary_cross_entropy.default, x, t, w, reduction)[0]
    g = rnd(*out.shape, seed=25)
    check(aten.binary_cross_entropy_backward.default, g, x, t, w, reduction)


def test_binary_cross_entropy_clamps_and_defaults():
    x = torch.tensor([0.0, 1.0, 1e-30, 0.5, 1.0 - 1e-7])
    t = torch.tensor([0.0, 1.0, 1.0, 0.3, 0.0])
    check(aten.binary_cross_entropy.default, x, t, None, 0)
    check(aten.binary_cross_entropy.default, x, t)  # reduction default (mean) omitted
    check(aten.binary_cross_entropy_backward.default, torch.ones(5), x, t, None, 0,
          tol=dict(rtol=1e-5, atol=1e-5))


@pytest.mark.parametrize("op,bwd", [(aten.smooth_l1_loss.default, aten.smooth_l1_loss_backward.default),
                                    (aten.huber_loss.default, aten.huber_loss_backward.default)])
@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("beta", [1.0, 0.5, 2.5, 0.0])
def test_smooth_l1_and_huber(op, bwd, reduction, beta):
    if op is aten.huber_loss.default and beta == 0.0:
        beta = 0.1  # huber requires delta > 0
    x, t = _loss_inputs((5, 7), "l1")
    x[0, :3] = t[0, :3]  # exact zeros of the difference
    x[1, 0] = t[1, 0] + beta  # exactly on the boundary
    x[1, 1] = t[1, 1] - beta
    out = check(op, x, t, reduction, beta)[0]
    g = rnd(*out.shape, seed=26)
    check(bwd, g, x, t, reduction, beta)


def test_smooth_l1_defaults_omitted():
    x, t = _loss_inputs((3, 4), "l1")
    check(aten.smooth_l1_loss.default, x, t)
    check(aten.huber_loss.default, x, t)
    check(aten.mse_loss.default, x, t)


# ---------------------------------------------------------------------------------------
# Layer norm.
@pytest.mark.parametrize("shape,norm", [((4, 8), [8]), ((2, 3, 6), [3, 6]), ((2, 3, 5), [5]),
                                        ((7,), [7])])
@pytest.mark.parametrize("affine", [(True, True), (False, False), (True, False)])
def test_native_layer_norm(shape, norm, affine):
    x = rnd(*shape, seed=27) * 3 + 1
    w = rnd(*norm, seed=28) if affine[0] else None
    b = rnd(*norm, seed=29) if affine[1] else None
    out, mean, rstd = check(aten.native_layer_norm.default, x, norm, w, b, 1e-5)
    g = rnd(*shape, seed=30)
    for m0, m1, m2 in ([True, True, True], [True, False, False], [False, True, True]):
        # as autograd does: no gradient is asked for an absent weight / bias
        mask = [m0, m1 and w is not None, m2 and b is not None]
        check(aten.native_layer_norm_backward.default, g, x, norm, mean, rstd, w, b, mask,
              tol=dict(rtol=1e-4, atol=1e-5))


def test_native_layer_norm_double_bf16():
    x, w, b = rnd(3, 16, seed=31), rnd(16, seed=32), rnd(16, seed=33)
    check(aten.native_layer_norm.default, x.double(), [16], w.double(), b.double(), 1e-6)
    # meta says mean/rstd are float32 for bf16 input, eager CPU returns them in bf16
    check(aten.native_layer_norm.default, x.bfloat16(), [16], w.bfloat16(), b.bfloat16(), 1e-5,
          meta_dtype_differs=True)


# ---------------------------------------------------------------------------------------
# Embedding.
def test_embedding():
    w = rnd(10, 4, seed=34)
    idx = torch.tensor([[1, 3, 3], [9, 0, 3]])
    check(aten.embedding.default, w, idx)
    check(aten.embedding.default, w, torch.tensor(7), 2)
    check(aten.embedding.default, w.double(), idx.int(), -1, False, False)


@pytest.mark.parametrize("padding_idx", [-1, 3, 0])
@pytest.mark.parametrize("scale", [False, True])
def test_embedding_dense_backward(padding_idx, scale):
    idx = torch.tensor([[1, 3, 3], [9, 0, 3], [3, 1, 7]])
    g = rnd(3, 3, 5, seed=35)
    check(aten.embedding_dense_backward.default, g, idx, 10, padding_idx, scale)


# ---------------------------------------------------------------------------------------
# Activations.
def _act_input(dtype=torch.float32):
    x = torch.cat([rnd(40, seed=36) * 4, torch.tensor([0.0, -1.0, 1.0, -3.0, 3.0, 6.0, -6.0, 0.5,
                                                       25.0, -25.0, 1e-8, -1e-8])])
    return x.reshape(4, 13).to(dtype)


UNARY = [
    (aten.gelu.default, (), {}),
    (aten.gelu.default, (), {"approximate": "tanh"}),
    (aten.silu.default, (), {}),
    (aten.hardtanh.default, (), {}),
    (aten.hardtanh.default, (0.0, 6.0), {}),
    (aten.hardtanh.default, (-2.5, 0.5), {}),
    (aten.leaky_relu.default, (), {}),
    (aten.leaky_relu.default, (0.2,), {}),
    (aten.elu.default, (), {}),
    (aten.elu.default, (1.6732632423543772, 1.0507009873554805, 1), {}),
    (aten.elu.default, (0.7, 1.3, 0.5), {}),
    (aten.softplus.default, (), {}),
    (aten.softplus.default, (2.0, 5.0), {}),
    (aten.softplus.default, (0.5, 1), {}),
    (aten.hardsigmoid.default, (), {}),
    (aten.hardswish.default, (), {}),
]


@pytest.mark.parametrize("op,extra,kw", UNARY, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_unary_activation(op, extra, kw, dtype):
    check(op, _act_input(dtype), *extra, **kw)


BACKWARD = [
    # (backward op, extra args after (grad, input), kwargs, forward op for the output-based ones)
    (aten.gelu_backward.default, (), {}, None),
    (aten.gelu_backward.default, (), {"approximate": "tanh"}, None),
    (aten.silu_backward.default, (), {}, None),
    (aten.hardtanh_backward.default, (-1, 1), {}, None),
    (aten.hardtanh_backward.default, (0.0, 6.0), {}, None),
    (aten.leaky_relu_backward.default, (0.01, False), {}, None),
    (aten.leaky_relu_backward.default, (0.3, True), {}, None),
    (aten.softplus_backward.default, (1, 20), {}, None),
    (aten.softplus_backward.default, (2.0, 5.0), {}, None),
    (aten.threshold_backward.default, (0,), {}, None),
    (aten.threshold_backward.default, (0.5,), {}, None),
    (aten.sigmoid_backward.default, (), {}, torch.sigmoid),
    (aten.tanh_backward.default, (), {}, torch.tanh),
]


@pytest.mark.parametrize("op,extra,kw,fwd", BACKWARD,
                         ids=lambda v: getattr(v, "__name__", str(v)))  # no addresses: the same ids in every worker
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_activation_backward(op, extra, kw, fwd, dtype):
    x = _act_input(dtype)
    if fwd is not None:
        x = fwd(x)
    g = rnd(*x.shape, seed=37, dtype=dtype)
    check(op, g, x, *extra, **kw)


@pytest.mark.parametrize("params", [(1, 1, 1), (1.6732632423543772, 1.0507009873554805, 1),
                                    (0.7, 1.3, 0.5)])
@pytest.mark.parametrize("is_result", [False, True])
def test_elu_backward(params, is_result):
    x = _act_input()
    y = aten.elu.default(x, *params) if is_result else x
    g = rnd(*x.shape, seed=38)
    check(aten.elu_backward.default, g, *params, is_result, y)


def test_prelu_kernel():
    x = rnd(2, 3, 4, 4, seed=39)
    check(aten._prelu_kernel.default, x, rnd(3, 1, 1, seed=40))
    check(aten._prelu_kernel.default, x, torch.tensor([0.25]))
    check(aten._prelu_kernel.default, x.double(), rnd(3, 1, 1, seed=40).double())


@pytest.mark.parametrize("shape,dim", [((4, 6), -1), ((4, 6), 0), ((2, 8, 3), 1)])
def test_glu(shape, dim):
    check(aten.glu.default, rnd(*shape, seed=41), dim)
    check(aten.glu.default, rnd(*shape, seed=41).double(), dim)


def test_glu_default_dim():
    check(aten.glu.default, rnd(3, 4, seed=42))


# ---------------------------------------------------------------------------------------
# End to end through the lazy device.
def _close(a, b, rtol=1e-5, atol=1e-5):
    torch.testing.assert_close(a.cpu(), b, rtol=rtol, atol=atol)


def _train_step(model_fn, inputs, loss_fn):
    """Run forward+backward eagerly and on the device; return both (out, grads) pairs."""
    torch.manual_seed(0)
    ref = model_fn()
    torch.manual_seed(0)
    dev = lazyxla.device()
    mod = model_fn().to(dev)
    out_ref = ref(*inputs)
    loss_fn(out_ref).backward()
    out = mod(*[i.to(dev) for i in inputs])
    loss_fn(out).backward()
    lazyxla.sync()
    return (out_ref, [p.grad for p in ref.parameters()]), (out, [p.grad for p in mod.parameters()])


def test_device_conv2d_forward_backward():
    x = rnd(2, 3, 10, 10, seed=50)
    (yr, gr), (y, g) = _train_step(lambda: torch.nn.Conv2d(3, 4, 3, stride=2, padding=1), [x],
                                   lambda y: y.sum())
    _close(y, yr)
    for a, b in zip(g, gr):
        _close(a, b, rtol=1e-5, atol=1e-4)


def test_device_input_grad_through_conv_and_pools():
    dev = lazyxla.device()
    x = rnd(2, 3, 12, 12, seed=51)
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 6, 3, padding=1, groups=3)
    xd = x.clone().to(dev).requires_grad_()
    xr = x.clone().requires_grad_()
    convd = torch.nn.Conv2d(3, 6, 3, padding=1, groups=3).to(dev)
    convd.load_state_dict({k: v.to(dev) for k, v in conv.state_dict().items()})

    def net(c, inp):
        h = torch.nn.functional.max_pool2d(c(inp), 3, 2, 1, ceil_mode=True)
        h = torch.nn.functional.avg_pool2d(torch.nn.functional.gelu(h), 2, count_include_pad=False)
        return torch.nn.functional.adaptive_avg_pool2d(h, (2, 2)).sum()

    net(conv, xr).backward()
    net(convd, xd).backward()
    lazyxla.sync()
    _close(xd.grad, xr.grad, atol=1e-5)
    _close(convd.weight.grad, conv.weight.grad, atol=1e-4)


def test_device_classifier_step():
    dev = lazyxla.device()
    x = rnd(8, 10, seed=52)
    tgt = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2])

    def make():
        return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.LayerNorm(16), torch.nn.SiLU(),
                                   torch.nn.Linear(16, 5))

    torch.manual_seed(0)
    ref = make()
    torch.manual_seed(0)
    mod = make().to(dev)
    lr = torch.nn.functional.cross_entropy(ref(x), tgt, ignore_index=3)
    lr.backward()
    ld = torch.nn.functional.cross_entropy(mod(x.to(dev)), tgt.to(dev), ignore_index=3)
    ld.backward()
    lazyxla.sync()
    _close(ld, lr.detach())
    for a, b in zip(mod.parameters(), ref.parameters()):
        _close(a.grad, b.grad, atol=1e-5)


def test_device_embedding_and_losses():
    dev = lazyxla.device()
    idx = torch.tensor([[1, 2, 2], [0, 5, 1]])
    torch.manual_seed(0)
    emb = torch.nn.Embedding(6, 4, padding_idx=2)
    embd = torch.nn.Embedding(6, 4, padding_idx=2).to(dev)
    embd.load_state_dict({k: v.to(dev) for k, v in emb.state_dict().items()})
    tgt = rnd(2, 3, 4, seed=53)

    def loss(e, i, t):
        h = e(i)
        return (torch.nn.functional.smooth_l1_loss(h, t, beta=0.5)
                + torch.nn.functional.mse_loss(torch.tanh(h), t)
                + torch.nn.functional.binary_cross_entropy(torch.sigmoid(h), torch.sigmoid(t)))

    lr = loss(emb, idx, tgt)
    lr.backward()
    ld = loss(embd, idx.to(dev), tgt.to(dev))
    ld.backward()
    lazyxla.sync()
    _close(ld, lr.detach())
    _close(embd.weight.grad, emb.weight.grad, atol=1e-6)


_RESIZE = [("nearest", None, dict(scale_factor=2)), ("nearest", None, dict(scale_factor=1.7)),
           ("nearest", None, dict(size=(2, 3))), ("bilinear", False, dict(scale_factor=2)),
           ("bilinear", False, dict(scale_factor=0.6)), ("bilinear", True, dict(size=(5, 9))),
           ("bilinear", False, dict(size=(8, 8)))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("mode, align, size", _RESIZE, ids=lambda v: str(v))
def test_device_interpolate_forward_and_backward(mode, align, size, dtype):
    # F.interpolate's forward and backward both lowered (no aten::upsample_*_backward fallback)
    from lazyhelp import cnt
    dev = lazyxla.device()
    extra = {} if align is None else {"align_corners": align}
    x = rnd(2, 3, 3, 5, seed=61).to(dtype).requires_grad_()
    lx = x.detach().to(dev).requires_grad_()
    y = torch.nn.functional.interpolate(x, mode=mode, **size, **extra)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(62), dtype=dtype)
    (y * g).sum().backward()
    before = cnt(f"aten::upsample_{mode}2d_backward")
    ly = torch.nn.functional.interpolate(lx, mode=mode, **size, **extra)
    (ly * g.to(dev)).sum().backward()
    lazyxla.sync()
    assert cnt(f"aten::upsample_{mode}2d_backward") == before
    torch.testing.assert_close(ly.cpu(), y.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lx.grad.cpu(), x.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")], ids=str)
def test_device_embedding_max_norm_renorms_rows_in_place(norm_type):
    # nn.Embedding(max_norm=...) renorms the looked-up rows of its weight, on the device
    import copy
    from lazyhelp import cnt
    dev = lazyxla.device()
    torch.manual_seed(0)
    m = torch.nn.Embedding(10, 4, max_norm=1.0, norm_type=norm_type)
    lm = copy.deepcopy(m).to(dev)
    idx = torch.tensor([[1, 2, 3], [3, 4, 9]])
    before = cnt("aten::embedding_renorm_")
    y, ly = m(idx), lm(idx.to(dev))
    y.sum().backward()
    ly.sum().backward()
    lazyxla.sync()
    assert cnt("aten::embedding_renorm_") == before
    _close(ly, y.detach(), atol=1e-6)
    _close(lm.weight.detach(), m.weight.detach(), atol=1e-6)
    _close(lm.weight.grad, m.weight.grad, atol=1e-6)


def test_device_bilinear_layer_forward_and_backward():
    # nn.Bilinear goes through aten::_trilinear (it fell back to the CPU)
    import copy
    from lazyhelp import cnt
    dev = lazyxla.device()
    torch.manual_seed(0)
    m = torch.nn.Bilinear(3, 4, 2)
    lm = copy.deepcopy(m).to(dev)
    a, b = rnd(5, 3, seed=71).requires_grad_(), rnd(5, 4, seed=72).requires_grad_()
    la, lb = a.detach().to(dev).requires_grad_(), b.detach().to(dev).requires_grad_()
    before = cnt("aten::_trilinear")
    m(a, b).pow(2).sum().backward()
    lm(la, lb).pow(2).sum().backward()
    lazyxla.sync()
    assert cnt("aten::_trilinear") == before
    _close(la.grad, a.grad)
    _close(lb.grad, b.grad)
    _close(lm.weight.grad, m.weight.grad, atol=1e-4)


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")], ids=str)
def test_device_cdist_backward_matches_eager_with_a_zero_distance(p):
    from lazyhelp import cnt
    dev = lazyxla.device()
    a, b = rnd(2, 4, 3, seed=81), rnd(2, 5, 3, seed=82)
    b[0, 1] = a[0, 2]  # a zero distance: PyTorch's gradient is 0 there, not 0/0
    g = rnd(2, 4, 5, seed=83)
    x1, x2 = a.clone().requires_grad_(), b.clone().requires_grad_()
    l1, l2 = a.to(dev).requires_grad_(), b.to(dev).requires_grad_()
    before = cnt("aten::_cdist_backward")
    (torch.cdist(x1, x2, p=p) * g).sum().backward()
    (torch.cdist(l1, l2, p=p) * g.to(dev)).sum().backward()
    lazyxla.sync()
    assert cnt("aten::_cdist_backward") == before
    _close(l1.grad, x1.grad)
    _close(l2.grad, x2.grad)


def test_many_channels_on_a_small_map_are_a_dot_and_a_large_map_stays_a_convolution():
    import lazyxla
    dev = lazyxla.device()
    small = torch.nn.functional.conv2d(rnd(2, 256, 4, 4).to(dev), rnd(16, 256, 3, 3, seed=1).to(dev), padding=1)
    large = torch.nn.functional.conv2d(rnd(2, 8, 16, 16).to(dev), rnd(16, 8, 3, 3, seed=1).to(dev), padding=1)
    assert "convolution" not in lazyxla.dump_hlo([small]) and "dot" in lazyxla.dump_hlo([small])
    assert "convolution" in lazyxla.dump_hlo([large])
    torch.testing.assert_close(small.cpu(), torch.nn.functional.conv2d(rnd(2, 256, 4, 4), rnd(16, 256, 3, 3, seed=1),
                                                                      padding=1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", ["train", "eval", "no-affine", "no-running-stats", "1d", "3d"])
def test_batch_norm_backward_is_one_node_with_eagers_gradients(kind, dt):
    from lazyhelp import cnt
    dev = lazyxla.device()
    torch.manual_seed(0)
    cls, shape = {"1d": (torch.nn.BatchNorm1d, (6, 3, 5)), "3d": (torch.nn.BatchNorm3d, (2, 3, 3, 4, 2))}.get(
        kind, (torch.nn.BatchNorm2d, (4, 3, 5, 5)))
    bn = cls(3, affine=kind != "no-affine", track_running_stats=kind != "no-running-stats").to(dt)
    if bn.track_running_stats:
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 1.5)
    if bn.affine:
        bn.weight.data.uniform_(0.5, 1.5)
    bn.train(kind != "eval")
    x, g = torch.randn(shape, dtype=dt), torch.randn(shape, dtype=dt)
    got_bn = cls(3, affine=bn.affine, track_running_stats=bn.track_running_stats).to(dt)
    got_bn.load_state_dict(bn.state_dict())
    got_bn = got_bn.to(dev).train(bn.training)
    xs = [x.clone().requires_grad_(True), x.to(dev).requires_grad_(True)]
    before = cnt("xla::native_batch_norm_backward")
    for m, xi, gi in ((bn, xs[0], g), (got_bn, xs[1], g.to(dev))):
        (m(xi) * gi).sum().backward()
    lazyxla.sync()
    assert cnt("xla::native_batch_norm_backward") - before == 1
    want = [xs[0].grad] + ([bn.weight.grad, bn.bias.grad] if bn.affine else [])
    got = [xs[1].grad.cpu()] + ([got_bn.weight.grad.cpu(), got_bn.bias.grad.cpu()] if bn.affine else [])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **({"rtol": 1e-4, "atol": 1e-5} if dt == torch.float32 else TOL[dt]))
