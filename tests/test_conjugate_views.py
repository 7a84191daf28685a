"""The conjugate-view family against eager, forward and backward (issue 51).

Eager PyTorch conjugates lazily: ``conj()`` of a complex tensor is a view with a bit set, and
ops read the bit (``resolve_conj``, ``view_as_real`` refuses an unresolved one). On the lazy
device ``_conj`` is a node whose lowering computes the values. Where the two meet (a small read
answered on the host by eager's kernels, ``engine.host_reads``; a gradient formula that views a
conjugate as real) a bit left on a host tensor gave ``fft.hfft`` wrong values. Each op here runs
PyTorch's OpInfo samples one after the other in one process (so reads of a structure seen with
other sizes are answered on the host), its output and its input's gradient compared with eager."""
import pytest
import torch

import lazyxla
import lazyxla.debug.metrics as met

DEV = lazyxla.device()
pytestmark = pytest.mark.usefixtures("nothing_pending")

# op name -> the dtypes its samples run in (complex where the op takes complex input)
FAMILY = {
    "conj": (torch.complex64,), "conj_physical": (torch.complex64,), "resolve_conj": (torch.complex64,),
    "view_as_real": (torch.complex64,), "real": (torch.complex64,), "imag": (torch.complex64,),
    "fft.fft": (torch.complex64, torch.float32), "fft.ifft": (torch.complex64, torch.float32),
    "fft.rfft": (torch.float32,), "fft.irfft": (torch.complex64, torch.float32),
    "fft.irfft2": (torch.complex64,), "fft.irfftn": (torch.complex64,),
    "fft.hfft": (torch.complex64, torch.float32), "fft.hfft2": (torch.complex64,),
    "fft.hfftn": (torch.complex64,), "fft.ihfft": (torch.float32,), "fft.ihfft2": (torch.float32,),
    "fft.ihfftn": (torch.float32,),
}
SAMPLES = 3


def _opinfo(name):
    from torch.testing._internal.common_methods_invocations import op_db
    return next(o for o in op_db if o.name == name and not o.variant_test_name)


def _weighted(out):
    """A real scalar of every output value, each weighted differently (complex outputs through
    ``view_as_real``: its backward is part of what is checked)."""
    t = torch.view_as_real(out.resolve_conj()) if out.is_complex() else out
    w = torch.linspace(-1.0, 2.0, t.numel(), dtype=t.dtype).reshape(t.shape)
    return (t * w.to(t.device)).sum()


def _run(opinfo, sample, dev):
    leaf = sample.input.detach().to(dev).requires_grad_()
    args = [a.detach().to(dev) if isinstance(a, torch.Tensor) else a for a in sample.args]
    out = sample.output_process_fn_grad(opinfo(leaf, *args, **sample.kwargs))
    value = out.detach().resolve_conj().to("cpu")  # read on its own: the host may answer it
    grad, = torch.autograd.grad(_weighted(out), leaf)
    return value, grad.to("cpu")


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_values_and_gradients_are_eagers(name):
    opinfo = _opinfo(name)
    checked = 0
    for dtype in FAMILY[name]:
        for i, sample in enumerate(list(opinfo.sample_inputs("cpu", dtype, requires_grad=True))[:SAMPLES]):
            want_v, want_g = _run(opinfo, sample, "cpu")
            got_v, got_g = _run(opinfo, sample, DEV)
            where = f"{name} {dtype} sample {i} {sample.kwargs}"
            torch.testing.assert_close(got_v, want_v, rtol=1e-4, atol=1e-4, msg=lambda m: f"{where}: value: {m}")
            torch.testing.assert_close(got_g, want_g, rtol=1e-4, atol=1e-4, msg=lambda m: f"{where}: grad: {m}")
            checked += 1
    assert checked >= len(FAMILY[name])  # every dtype had a sample


def test_hfft_read_answered_on_the_host_has_eagers_values():
    """The case that was wrong: ``hfft`` is ``_conj`` then ``_fft_c2r``; read a second time at
    other sizes, the host answers the read with eager's kernels, and eager's ``_conj`` leaves a
    bit that its ``_fft_c2r`` does not read."""
    x = torch.randn(5, 6, 7, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
    xd = x.to(DEV)
    for kw in ({"n": 10, "dim": 1, "norm": "ortho"}, {"norm": "ortho"}, {"n": 7}):
        before = met.counter_value("HostAnsweredRead") or 0
        got = torch.fft.hfft(xd, **kw).cpu()
        torch.testing.assert_close(got, torch.fft.hfft(x, **kw), rtol=1e-5, atol=1e-4, msg=lambda m: f"{kw}: {m}")
    assert (met.counter_value("HostAnsweredRead") or 0) > before  # the last reads took the host's path
