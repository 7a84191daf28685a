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


def check(fn, *args, rtol=1e-5, atol=1e-5, **kwargs):
    """``fn`` on the lazy device equals ``fn`` on the CPU (dtypes included), without a CPU
    fallback. Returns the CPU result."""
    want = fn(*args, **kwargs)
    before = _fallbacks()
    got = fn(*_dev(args), **_dev(kwargs))
    lazyxla.sync()
    got = _host(got)
    moved = {k: v for k, v in _fallbacks().items() if before.get(k) != v}
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
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64, torch.float64])
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


def test_logcumsumexp_infinities_and_complex():
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[-inf, -inf, 1., inf, inf, nan, 2.], [inf, -inf, 1., 0.5, -2., 3., 0.]])
    z = torch.tensor([-inf + 1j, -inf + 2j, 1 + 2j, 3 - 1j, inf + 1j, inf + 2j, 1], dtype=torch.complex64)
    check(lambda x, z, r: (torch.logcumsumexp(x, 1), torch.logcumsumexp(z, 0), torch.logcumsumexp(r, 0)),
          x, z, rand(5, 3, dtype=torch.float64))


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
