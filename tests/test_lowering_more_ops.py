"""Ops that used to run on the CPU, now lowered (issue 10): values against PyTorch eager CPU
on small inputs, ties and edge cases included, and no ``aten::*`` fallback counter moved.

Each check runs the same function on CPU tensors and on their copies on the lazy device,
reads every result once (one program per check) and compares.
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
