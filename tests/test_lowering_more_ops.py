"""Ops that used to run on the CPU, now lowered (issue 10): values against PyTorch eager CPU
on small inputs, ties and edge cases included, and no ``aten::*`` fallback counter moved.

Each check runs the same function on CPU tensors and on their copies on the lazy device,
syncs (one program per check), reads the results and compares.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lazyxla
import lazyxla.debug.metrics as met
from lazyhelp import on_the_cpu_here

DEV = lazyxla.device()


def _fallbacks():
    return {n: met.counter_value(n) for n in met.counter_names() if n.startswith("aten::")}


def _dev(x):
    if isinstance(x, torch.Tensor):
        return x.to(DEV)
    if isinstance(x, (list, tuple)):
        return type(x)(_dev(y) for y in x)
    if isinstance(x, dict):
        return {k: _dev(v) for k, v in x.items()}
    return x


def _host(x):
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(_host(y) for y in x)
    return x


def check(fn, *args, rtol=1e-5, atol=1e-5, allowed=(), **kwargs):
    """``fn`` on the lazy device equals ``fn`` on the CPU (dtypes included), without a CPU
    fallback but those ``allowed`` names. Returns the CPU result."""
    want = fn(*args, **kwargs)
    before = _fallbacks()
    got = fn(*_dev(args), **_dev(kwargs))
    lazyxla.sync()
    got = _host(got)
    moved = {k: v for k, v in _fallbacks().items() if before.get(k) != v and k not in allowed}
    assert not moved, f"CPU fallbacks: {moved}"
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)
    return want


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_complex:
        return torch.randn(*shape, dtype=dtype, generator=g)
    return torch.randn(*shape, generator=g).to(dtype)


# ---------------------------------------------------------------------------------------
# FFT (lowering/fft.py)
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64, pytest.param(
    torch.float64, marks=pytest.mark.cpu_only("XLA's TPU compiler has no float64 FFT"))])
def test_fft_c2c_many_dims(dtype):
    x = rand(3, 4, 5, dtype=dtype)
    check(lambda x: (torch.fft.fft2(x), torch.fft.ifft2(x, norm="ortho"), torch.fft.fftn(x, norm="forward"),
                     torch.fft.ifftn(x, dim=(0, 2)), torch.fft.fft(x, n=7), torch.fft.ifft(x, dim=0)), x,
          rtol=1e-4, atol=1e-4)


def test_fft_real_and_hermitian():
    x = rand(4, 6)
    z = rand(4, 6, dtype=torch.complex64, seed=1)
    check(lambda x, z: (torch.fft.rfft2(x), torch.fft.rfftn(x, s=(3, 8)), torch.fft.irfft2(z),
                        torch.fft.irfftn(z, s=(4, 9), norm="ortho"), torch.fft.hfft(z), torch.fft.ihfft(x),
                        torch.fft.hfft2(z, norm="forward"), torch.fft.ihfftn(x), torch.fft.ihfft2(x)),
          x, z, rtol=1e-4, atol=1e-4)


def test_stft_istft():
    x = rand(64)
    w = torch.hann_window(16)
    spec = check(lambda x, w: torch.stft(x, 16, hop_length=4, window=w, return_complex=True), x, w,
                 rtol=1e-4, atol=1e-4)
    assert spec.dtype == torch.complex64


# ---------------------------------------------------------------------------------------
# Scans (lowering/reduce.py)
def test_cummax_cummin_ties_and_nan():
    nan = float("nan")
    x = torch.tensor([[1., 3., 3., nan, 2., nan, 5.], [2., 2., 1., 1., 4., 4., 0.]])
    i = torch.tensor([3, 1, 3, 1, 0, 5, 5, 2])
    got = check(lambda x, i: (torch.cummax(x, 1), torch.cummin(x, 1), torch.cummax(x, 0), torch.cummin(i, 0),
                              torch.cummax(torch.tensor(2.5, device=x.device), 0)), x, i)
    # PyTorch: a tie moves the index to the later element; a NaN sticks, the last NaN's index
    assert got[0].indices[0].tolist() == [0, 1, 2, 3, 3, 5, 5]
    assert got[0].indices[1].tolist() == [0, 1, 1, 1, 4, 5, 5]


@pytest.mark.parametrize("dt", [torch.float32, torch.float64])
def test_logcumsumexp_infinities_and_complex(dt):
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[-inf, -inf, 1., inf, inf, nan, 2.], [inf, -inf, 1., 0.5, -2., 3., 0.]])
    z = torch.tensor([-inf + 1j, -inf + 2j, 1 + 2j, 3 - 1j, inf + 1j, inf + 2j, 1], dtype=torch.complex64)
    check(lambda x, z, r: (torch.logcumsumexp(x, 1), torch.logcumsumexp(z, 0), torch.logcumsumexp(r, 0)),
          x, z, rand(5, 3, dtype=dt), allowed=on_the_cpu_here(float64=dt == torch.float64, float32=True))


def test_hash_tensor():
    ts = [torch.tensor([True, False]), torch.tensor([-1, 2, 3], dtype=torch.int32), torch.tensor([1.5, -0.0]),
          torch.tensor([1.5], dtype=torch.bfloat16), rand(3, 4, 5, dtype=torch.float64)]
    got = check(lambda *ts: [torch.hash_tensor(t) for t in ts]
                + [torch.hash_tensor(ts[-1], [0]), torch.hash_tensor(ts[-1], [0, 2], keepdim=True)], *ts,
                allowed=on_the_cpu_here(float64=True))  # a TPU's float64 bits are not IEEE's: its CPU hashes them
    assert got[0].dtype == torch.uint64


# ---------------------------------------------------------------------------------------
# Order statistics (lowering/selection.py): PyTorch CPU's tie rules.
def _ties(*shape, hi=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, hi, shape, generator=g).float()


def test_kthvalue_ties_and_nan():
    x = _ties(3, 20)
    x[1, ::4] = float("nan")
    got = check(lambda x: (torch.kthvalue(x, 7, 1), torch.kthvalue(x, 7, 1, keepdim=True),
                           torch.kthvalue(torch.tensor(3., device=x.device), 1)), x)
    assert got[0].indices.dtype == torch.int64


def test_median_nanmedian_ties_nan_and_all_nan():
    nan = float("nan")
    x = _ties(4, 9, seed=1)
    x[1, 3] = nan
    x[2, 0::2] = nan
    x[3] = nan
    check(lambda x: (torch.median(x, 1), torch.nanmedian(x, 1), torch.median(x[0]), torch.nanmedian(x),
                     torch.median(x[:, :4], 0, keepdim=True), torch.nanmedian(x[:, 1:], 0)), x)
    # the lower median of an even count
    assert check(lambda x: torch.median(x), torch.tensor([4., 1., 3., 2.])).item() == 2.


def _median_of_three_killer(n):
    """Musser's input that drives libstdc++'s introsort to its heapsort fallback."""
    k, a = n // 2, [0] * n
    for i in range(1, k + 1):
        if i % 2:
            a[i - 1], a[i] = i, k + i
        a[k + i - 1] = 2 * i
    return torch.tensor(a).float()


def test_mode_ties_introsort_heapsort_and_nan():
    nan = float("nan")
    small = torch.tensor([[nan, 1., 0., 1., nan, 0., 2.], [3., 3., 1., 1., 2., 2., 0.]])
    got = check(lambda big, killer, small: (torch.mode(big, 1), torch.mode(killer // 4), torch.mode(small, 1),
                                            torch.mode(small, 0, keepdim=True)),
                _ties(3, 40, hi=4, seed=2), _median_of_three_killer(61), small)
    assert got[1].indices.item() == 2  # where a stable sort would give 60


# ---------------------------------------------------------------------------------------
# Indexing (lowering/indexing.py)
def test_take_put_last_write_wins():
    x = torch.arange(6.).reshape(2, 3)
    check(lambda x, i, j, s: (x.take(i), x.put(j, s), x.put(j, s, accumulate=True), torch.zeros(5, device=x.device)
                              .put(torch.tensor([1, 1, 3, 1], device=x.device), s[:4])),
          x, torch.tensor([[-1, 0], [2, 5]]), torch.tensor([1, -1, 1, 0, 1]), torch.tensor([1., 2., 3., 4., 5.]))


@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(include_self):
    nan = float("nan")
    s = torch.tensor([[1., nan], [3., 4.], [0., 7.]])
    y = torch.tensor([[2., 2.], [5., 5.], [1., 1.]])
    yi, si = torch.tensor([[2, 2], [5, 5], [1, 1]]), torch.tensor([[1, 2], [3, 4], [0, 7]])
    idx = torch.tensor([0, 0, 2])
    check(lambda y, idx, s, yi, si: [y.index_reduce(0, idx, s, r, include_self=include_self)
                                     for r in ("prod", "mean", "amax", "amin")]
          + [y.T.index_reduce(1, idx, s.T, "amax", include_self=include_self),
             yi.index_reduce(0, idx, si, "mean", include_self=include_self)], y, idx, s, yi, si)


def test_segment_reduce_forward_and_backward():
    nan = float("nan")
    data = torch.tensor([1., -2., -2., 0., nan, 2., 3.])
    lengths = torch.tensor([3, 0, 2, 2])
    offsets = torch.tensor([0, 3, 3, 5, 7])

    def run(d, lengths, offsets):
        outs = []
        for r in ("sum", "mean", "max", "min", "prod"):
            for kw in (dict(lengths=lengths), dict(offsets=offsets, initial=2.)):
                dd = d.clone().requires_grad_()
                out = torch.segment_reduce(dd, r, **kw)
                g, = torch.autograd.grad(out, dd, torch.tensor([1., -3., 2., 0.5], device=d.device))
                outs += [out.detach(), g]
        return outs

    check(run, data, lengths, offsets)
    check(lambda d, l: torch.segment_reduce(d, "sum", lengths=l, axis=1), torch.arange(12.).reshape(2, 6),
          torch.tensor([[2, 4], [3, 3]]))


def test_nonzero_static_and_zero_d_index_ops():
    x = torch.tensor([[0, 1.], [2, 0]])
    check(lambda x, a, i, b: (torch.nonzero_static(x, size=4), torch.nonzero_static(x, size=1, fill_value=7),
                              a.index_add(0, i, b), a.index_copy(0, i, b)),
          x, torch.tensor(1.), torch.tensor([0]), torch.tensor(2.))


# ---------------------------------------------------------------------------------------
# Pooling, matrix products, embedding bags
def test_adaptive_max_pool_unequal_windows_ties_nan_and_backward():
    nan = float("nan")
    x = torch.tensor([[[1., 3., 3., 2.], [3., 0., nan, nan], [1., 1., 1., 1.]]])
    y = _ties(2, 3, 7, 5, hi=4, seed=3)

    def run(x, y):
        yy = y.clone().requires_grad_()
        out, idx = F.adaptive_max_pool2d(yy, (3, 4), return_indices=True)
        g, = torch.autograd.grad((out * torch.arange(12., device=y.device).reshape(3, 4)).sum(), yy)
        return (F.adaptive_max_pool2d(x, (2, 3), return_indices=True), F.adaptive_max_pool1d(x[0], 3, True),
                out.detach(), idx, g)

    got = check(run, x, y)
    assert got[0][1].tolist() == [[[1, 6, 7], [4, 6, 7]]]  # the first maximum; the last NaN


def test_addbmm():
    b, x, y = rand(3, 4), rand(5, 3, 2, seed=1), rand(5, 2, 4, seed=2)
    b[0, 0] = float("nan")
    check(lambda b, x, y: (torch.addbmm(b, x, y), torch.addbmm(b, x, y, beta=0.5, alpha=2.),
                           torch.addbmm(b, x, y, beta=0)), b, x, y, rtol=1e-4, atol=1e-4)


def test_embedding_bag_without_autograd():
    w = rand(10, 3)
    idx, off = torch.tensor([1, 2, 4, 4, 3, 9]), torch.tensor([0, 2, 2, 5])
    with torch.no_grad():
        check(lambda w, i, o: [F.embedding_bag(i, w, o, mode=m) for m in ("sum", "mean", "max")]
              + [F.embedding_bag(i, w, o, mode="sum", per_sample_weights=torch.ones(6, device=w.device) * 2,
                                 padding_idx=4)], w, idx, off)


def test_masked_scatter_backward():
    x, m, src = rand(3, 4), torch.tensor([[1, 0, 1, 1], [0, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool), rand(5, 3)

    def run(x, m, s):
        s = s.clone().requires_grad_()
        o = x.masked_scatter(m, s)
        return torch.autograd.grad((o * o).sum(), s)

    check(run, x, m, src)


# ---------------------------------------------------------------------------------------
# Resampling (lowering/resample.py)
def _grads(fn, *inputs):
    """fn's output and the gradients of sum(output ** 2) for each input."""
    leaves = [t.clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    return (out.detach(),) + torch.autograd.grad((out * out).sum(), leaves)


def test_interpolate_backward_modes():
    x1, x2, x3 = rand(2, 3, 5), rand(2, 3, 5, 7, seed=1), rand(1, 2, 3, 4, 5, seed=2)

    def run(x1, x2, x3):
        out = []
        for x, modes, size in ((x1, ("nearest", "nearest-exact", "linear"), (8,)),
                               (x2, ("nearest-exact", "bicubic"), (3, 12)),
                               (x3, ("nearest", "nearest-exact", "trilinear"), (5, 2, 7))):
            for mode in modes:
                ac = {} if "nearest" in mode else dict(align_corners=mode == "bicubic")
                out += _grads(lambda t: F.interpolate(t, size=size, mode=mode, **ac), x)[1:]
        out += _grads(lambda t: F.interpolate(t, scale_factor=1.7, mode="linear", recompute_scale_factor=False),
                      x1)[1:]
        return out

    check(run, x1, x2, x3, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_antialiased_resampling(mode):
    x = rand(2, 3, 9, 11)
    check(lambda x: [g for size in ((4, 3), (13, 20)) for g in
                     _grads(lambda t: F.interpolate(t, size=size, mode=mode, antialias=True), x)]
          + [F.interpolate(x, scale_factor=0.37, mode=mode, antialias=True, align_corners=True)], x,
          rtol=1e-4, atol=1e-4)


def test_lanczos_antialiased_resampling():
    aten = torch.ops.aten
    check(lambda x: _grads(lambda t: aten._upsample_lanczos2d_aa(t, [4, 17], False), x), rand(1, 2, 9, 11),
          rtol=1e-4, atol=1e-4)


_GRID_CASES = {  # (mode, padding, align_corners): every mode, padding and corner rule at least once
    2: [("bilinear", "zeros", True), ("nearest", "border", False), ("bicubic", "reflection", False)],
    3: [("bilinear", "zeros", True), ("bilinear", "reflection", False), ("nearest", "border", True)],
}


@pytest.mark.parametrize("nd", [2, 3])
def test_grid_sample_forward_and_backward(nd):
    x = rand(*((2, 3, 4, 5, 6)[:nd + 2]))
    grid = rand(*((2, 3, 2, 4)[:nd + 1] + (nd,)), seed=1) * 1.3
    grid.view(-1, nd)[0] = torch.tensor([1., -1., 0.][:nd])    # exactly on a corner
    nan_grid = grid.clone()
    nan_grid.view(-1, nd)[1, 0] = float("nan")

    def run(x, grid, nan_grid):
        out = []
        for mode, pad, ac in _GRID_CASES[nd]:
            out += _grads(lambda a, g: F.grid_sample(a, g, mode=mode, padding_mode=pad, align_corners=ac), x, grid)
            if nd == 3:   # a NaN coordinate (the 2-d forward is PyTorch's decomposition, not the CPU kernel)
                out.append(F.grid_sample(x, nan_grid, mode=mode, padding_mode=pad, align_corners=ac))
        return out

    check(run, x, grid, nan_grid, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------
# Losses (lowering/loss.py)
def test_ctc_loss_forward():
    T, N, C = 12, 4, 6
    lp = rand(T, N, C).log_softmax(2)
    tg = torch.tensor([[1, 2, 2, 3, 1], [4, 4, 5, 1, 1], [1, 1, 1, 1, 1], [5, 3, 5, 2, 2]])
    il, tl = [12, 10, 7, 12], [5, 3, 0, 4]
    flat = torch.cat([tg[i, :tl[i]] for i in range(N)])
    check(lambda lp, tg, flat: [F.ctc_loss(lp, tg, il, tl, reduction=r, zero_infinity=z)
                                for r in ("none", "mean", "sum") for z in (False, True)]
          + [F.ctc_loss(lp, flat, il, tl, blank=2, reduction="none"),
             F.ctc_loss(lp[:3], tg, [3] * 4, [5] * 4, reduction="none")],   # no alignment: inf
          lp, tg, flat)

    def workspace(lp, tg):   # the log-alpha workspace, where PyTorch writes it
        nll, alpha = torch.ops.aten._ctc_loss(lp, tg, il, tl, 0, False)
        return [nll] + [alpha[b, :il[b], :2 * tl[b] + 1] for b in range(N)]

    check(workspace, lp, tg)


def test_linear_cross_entropy_chunked():
    from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions
    x, w, b = rand(6, 4), rand(5, 4, seed=1), rand(5, seed=2)
    t = torch.tensor([0, 4, -100, 2, 2, 1])
    cw = torch.rand(5, generator=torch.Generator().manual_seed(3))

    def run(x, w, b, t, cw):
        out = []
        for red in ("mean", "sum", "none"):
            for kw in (dict(), dict(linear_bias=b, weight=cw, ignore_index=-100)):
                opts = LinearCrossEntropyOptions(batch_chunk_size=4, allow_retain_graph=red == "sum")
                xs = [x.clone().requires_grad_(), w.clone().requires_grad_()]
                loss = F.linear_cross_entropy(xs[0], xs[1], t.clamp(min=0) if not kw else t, reduction=red,
                                              options=opts, **kw)
                out += [loss.detach(), *torch.autograd.grad(loss.sum(), xs)]
        return out

    before = met.counter_value("xla::_linear_cross_entropy_batch_chunked") or 0
    check(run, x, w, b, t, cw, rtol=1e-4, atol=1e-4)
    assert (met.counter_value("xla::_linear_cross_entropy_batch_chunked") or 0) > before


def test_index_fill():
    x = rand(3, 4)
    check(lambda x, i, v, s, n: (x.index_fill(1, i, 2.5), x.index_fill(0, i[:1], v), s.index_fill(0, i[:1] * 0, -3.),
                                 n.index_fill(-1, i[1:2], 9)),
          x, torch.tensor([0, -1, 0]), torch.tensor(7.), torch.tensor(1.), torch.arange(6).reshape(2, 3))


def test_pooling_3d_backward_and_fractional():
    x3 = _ties(2, 3, 6, 7, 8, hi=5, seed=4)
    x2 = _ties(2, 3, 9, 8, hi=5, seed=5)
    x2[0, 0, 0, :3] = float("nan")
    s2, s3 = torch.rand(2, 3, 2, generator=torch.Generator().manual_seed(6)), torch.rand(2, 3, 3)

    def run(x3, x2, s2, s3):
        return (_grads(lambda t: F.avg_pool3d(t, (2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0),
                                              count_include_pad=False), x3)
                + _grads(lambda t: F.adaptive_avg_pool3d(t, (4, 3, 5)), x3)
                + _grads(lambda t: F.max_pool3d(t, (2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0)), x3)
                + _grads(lambda t: F.adaptive_max_pool3d(t, (4, 3, 5)), x3)
                + (F.adaptive_max_pool3d(x3, (4, 3, 5), return_indices=True)[1],
                   F.fractional_max_pool2d(x2, (2, 3), output_size=(5, 4), return_indices=True, _random_samples=s2)[1],
                   F.fractional_max_pool3d(x3, (2, 3, 2), output_size=(4, 3, 5), return_indices=True,
                                           _random_samples=s3)[1])
                + _grads(lambda t: F.fractional_max_pool2d(t, 2, output_size=(1, 7), _random_samples=s2), x2))

    check(run, x3, x2, s2, s3)


def test_replication_pad_backward():
    check(lambda *xs: [g for x, pad in zip(xs, ((2, 1), (1, 2, 2, 0), (1, 1, 0, 2, 1, 0), (-1, 2, 1, -1)))
                       for g in _grads(lambda t: F.pad(t, pad, mode="replicate"), x)[1:]],
          rand(2, 3, 5), rand(2, 3, 5, 6, seed=1), rand(1, 2, 5, 6, 4, seed=2), rand(3, 5, 6, seed=3))


def test_margin_losses():
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0)).round(decimals=1)
    x[0, 1] = x[0, 0] - 1.0   # z == 0 exactly: no gradient there (PyTorch's z > 0)
    t, w = torch.tensor([0, 3, 1, 1, 2]), torch.rand(4)
    tt = torch.tensor([[3, 0, -1, 1], [1, 1, 2, -1], [-1, 2, 0, 0], [0, 1, 2, 3], [2, -1, -1, -1]])

    def run(x, t, w, tt):   # the forward ops (both backward ops wait for meta kernels, below)
        out = []
        for red in ("none", "mean", "sum"):
            out += [F.multi_margin_loss(x, t, p=2, margin=0.5, weight=w, reduction=red),
                    F.multilabel_margin_loss(x, tt, reduction=red)]
        return out

    check(run, x, t, w, tt)


def test_lowerings_waiting_for_meta_kernels():
    """PyTorch has no meta kernel for these backward ops, so the device runs them on the CPU
    for now; their lowerings are checked directly against eager."""
    import jax.numpy as jnp
    import numpy as np
    from lazyxla.lowering import loss, pooling
    aten = torch.ops.aten
    j = lambda t: jnp.asarray(t.numpy())
    x = torch.randn(5, 4)
    tt = torch.tensor([[3, 0, -1, 1], [1, 1, 2, -1], [-1, 2, 0, 0], [0, 1, 2, 3], [2, -1, -1, -1]])
    x[0, 1] = x[0, 0] - 1.0   # z == 0 exactly: no gradient there (PyTorch's z > 0)
    t, w = torch.tensor([0, 3, 1, 1, 2]), torch.rand(4)
    back = lambda got: torch.from_numpy(np.asarray(got))
    for red in (0, 1, 2):
        out, is_t = aten.multilabel_margin_loss_forward(x, tt, red)
        g = torch.randn(out.shape)
        want = aten.multilabel_margin_loss_backward(g, x, tt, red, is_t)
        torch.testing.assert_close(back(loss.multilabel_margin_loss_backward(None, j(g), j(x), j(tt), red, j(is_t))),
                                   want)
        for p, margin, wt in ((1, 1.0, None), (2, 0.5, w)):
            g = torch.randn(aten.multi_margin_loss(x, t, p, margin, wt, red).shape)
            want = aten.multi_margin_loss_backward(g, x, t, p, margin, wt, red)
            got = loss.multi_margin_loss_backward(None, j(g), j(x), j(t), p, margin, None if wt is None else j(wt), red)
            torch.testing.assert_close(back(got), want)
    x3, s3 = torch.randn(2, 3, 6, 7, 8), torch.rand(2, 3, 3)
    out, idx = F.fractional_max_pool3d(x3, (2, 3, 2), output_size=(4, 3, 5), return_indices=True, _random_samples=s3)
    g = torch.randn(out.shape)
    want = aten.fractional_max_pool3d_backward(g, x3, [2, 3, 2], [4, 3, 5], idx)
    got = pooling.fractional_max_pool3d_backward(None, j(g), j(x3), [2, 3, 2], [4, 3, 5], j(idx))
    torch.testing.assert_close(back(got), want)


def test_view_copy_ops():
    aten = torch.ops.aten
    x, z = rand(4, 6), rand(3, 2, dtype=torch.complex64)
    check(lambda x, z: [aten.select_copy.int(x, 1, -2), aten.slice_copy.Tensor(x, 1, 1, -1, 2),
                        *aten.split_copy.Tensor(x, 4, 1), aten.detach_copy(x), aten._reshape_copy(x, [3, -1]),
                        aten._reshape_alias_copy(x, [2, 12], [12, 1]), aten._neg_view_copy(x), aten._conj_copy(z),
                        aten.view_as_real_copy(z), aten.view_as_complex_copy(x.reshape(4, 3, 2)),
                        aten.narrow_copy(x, 1, 2, 3)], x, z)


def test_embedding_bag_per_sample_weights_backward():
    w, psw = rand(10, 3), torch.rand(6, generator=torch.Generator().manual_seed(1))
    idx = torch.tensor([1, 2, 4, 4, 3, 9])
    check(lambda w, i, o, o2, p: [g for pad in (None, 4) for offs, last in ((o, False), (o2, True))
                                  for g in _grads(lambda w_, p_: F.embedding_bag(i, w_, offs, mode="sum",
                                                                                  per_sample_weights=p_, padding_idx=pad,
                                                                                  include_last_offset=last), w, p)],
          w, idx, torch.tensor([0, 2, 2, 5]), torch.tensor([0, 2, 2, 5, 6]), psw)


# ---------------------------------------------------------------------------------------
# Ops PyTorch has no meta kernel for, lowered with lazyxla's shape rules (registry.SHAPE_RULES)
def test_geqrf():
    """Householder QR in LAPACK's packed form: tall, wide, square complex, batched, empty."""
    check(lambda *xs: [r for x in xs for r in torch.geqrf(x)],
          rand(5, 3), rand(3, 5, seed=1), rand(4, 4, dtype=torch.complex64, seed=2),
          rand(2, 3, 4, dtype=torch.float64, seed=3), rand(0, 3, seed=4), rand(2, 0, 2, seed=5))
    a, _ = torch.geqrf(rand(5, 3).to(DEV))
    assert a.stride() == (1, 5)   # column-major, as the CPU's


@pytest.mark.float64  # checked to 1e-9; XLA's TPU compiler has no pivoted QR (gelsy: geqp3)
def test_lstsq_drivers_shapes_and_backward():
    """Every driver's four outputs with PyTorch's CPU shapes (empty ones included), vector and
    broadcast right-hand sides, rcond, and the backward of the solution and residuals."""
    a_tall, a_sq, a_wide = rand(5, 3, dtype=torch.float64), rand(3, 3, dtype=torch.float64, seed=1), \
        rand(2, 4, 3, dtype=torch.float64, seed=2).mT
    b_tall, b_sq, b_wide = rand(5, 2, dtype=torch.float64, seed=3), rand(3, 2, dtype=torch.float64, seed=4), \
        rand(1, 3, 1, dtype=torch.float64, seed=5)
    deficient = torch.cat([a_wide[0], a_wide[0, :1] * 2])    # 4 x 4, rank 3: gelsd's rank and rcond

    def run(at, bt, asq, bsq, aw, bw, d):
        out = []
        for drv in ("gels", "gelsy", "gelsd", "gelss", None):
            out += torch.linalg.lstsq(asq, bsq, driver=drv) + torch.linalg.lstsq(aw, bw, driver=drv)
            out += torch.linalg.lstsq(at, bt[:, 0], driver=drv) if drv in ("gels", "gelsy", None) else []
        out += torch.linalg.lstsq(d, bsq[:1].expand(4, 2), driver="gelsd", rcond=1e-6)
        out += torch.linalg.lstsq(at.to(torch.complex128), bt.to(torch.complex128), driver="gels")
        return out

    check(run, a_tall, b_tall, a_sq, b_sq, a_wide, b_wide, deficient, rtol=1e-9, atol=1e-9)
    check(lambda a, b, aw, bw: _grads(lambda x, y: torch.linalg.lstsq(x, y, driver="gels").residuals, a, b)
          + _grads(lambda x, y: torch.linalg.lstsq(x, y).solution, a, b)
          + _grads(lambda x, y: torch.linalg.lstsq(x, y, driver="gelsd").solution, aw, bw),
          a_tall, b_tall, a_wide, b_wide, rtol=1e-9, atol=1e-9)
    # gelsd/gelss with m > n: residuals only if every matrix has rank n, a value: the CPU's
    c0 = met.counter_value("aten::linalg_lstsq") or 0
    got = torch.linalg.lstsq(a_tall.to(DEV), b_tall.to(DEV), driver="gelss")
    assert met.counter_value("aten::linalg_lstsq") - c0 == 1
    torch.testing.assert_close(_host(list(got)), list(torch.linalg.lstsq(a_tall, b_tall, driver="gelss")))


def test_histogram_and_histogramdd():
    """Edges from the data (bit for bit: PyTorch's linspace), from a range or given; weights,
    density, values on the edges and outside them, NaN, an empty input, one value only."""
    x = torch.tensor([[0.5, -1.0, 2.0, 3.0], [1.25, float("nan"), 0.0, -0.25], [2.0, 2.0, 1.0, 0.3]])
    w, edges = torch.rand(3, 4, generator=torch.Generator().manual_seed(1)), torch.tensor([-1.0, 0.0, 0.3, 2.0])
    pts, pw = rand(9, 2, dtype=torch.float64), torch.rand(9, dtype=torch.float64)
    e0, e1, many = torch.linspace(-1, 1, 4, dtype=torch.float64), torch.tensor([-2.0, 0.5, 3.0], dtype=torch.float64), \
        rand(40, seed=2)

    def run(x, w, edges, pts, pw, e0, e1, many):
        clean = torch.nan_to_num(x)
        return [*torch.histogram(clean, 7), *torch.histogram(x, 4, range=(-1.0, 2.0), weight=w, density=True),
                *torch.histogram(x, edges), *torch.histogram(clean, edges, weight=w, density=True),
                *torch.histogram(x[:0], 3), *torch.histogram(x[2, :2], 2), *torch.histogram(many, 37),
                torch.histogramdd(pts, [3, 2]).hist, *torch.histogramdd(pts, [3, 2]).bin_edges,
                *torch.histogramdd(pts, 2, range=[-1.0, 1.0, 0.0, 2.0], weight=pw, density=True),
                *torch.histogramdd(pts, [e0, e1], weight=pw)]

    check(run, x, w, edges, pts, pw, e0, e1, many, rtol=0, atol=1e-6)


def test_ctc_loss_tensor_lengths_and_backward():
    """Lengths as device tensors (masks, never shapes) and as lists; 2-d and concatenated
    targets, repeated labels, an empty target, an input length 0, an impossible alignment
    (inf) with and without zero_infinity; the backward (PyTorch's formula) in each case."""
    T, N, C = 8, 4, 5
    lp = rand(T, N, C).log_softmax(2)
    tg = torch.tensor([[1, 2, 2, 3], [4, 4, 1, 1], [1, 1, 1, 1], [3, 3, 3, 2]])
    il, tl = [8, 6, 0, 4], [4, 2, 0, 4]
    flat = torch.cat([tg[i, :tl[i]] for i in range(N)])

    def run(lp, tg, flat, ilt, tlt):
        out = []
        for targets, lengths in ((tg, (ilt, tlt)), (flat, (ilt, tlt)), (tg, (il, tl))):
            for red, zero_inf in (("none", False), ("mean", True), ("sum", True)):
                out += _grads(lambda x: F.ctc_loss(x, targets, *lengths, reduction=red, zero_infinity=zero_inf), lp)
        return out

    check(run, lp, tg, flat, torch.tensor(il), torch.tensor(tl, dtype=torch.int32))
