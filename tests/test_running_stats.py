"""Batch norm in training as one node that writes the running statistics (``running_stats``):
the same outputs, gradients and running statistics as eager, step after step."""
import copy

import pytest
import torch

import lazyxla
import lazyxla.debug.metrics as met

FORMS = {
    "2d": (lambda: torch.nn.BatchNorm2d(6), (4, 6, 5, 5)),
    "1d": (lambda: torch.nn.BatchNorm1d(6), (8, 6)),
    "1d-seq-cumulative": (lambda: torch.nn.BatchNorm1d(6, momentum=None), (4, 6, 3)),
    "2d-no-affine": (lambda: torch.nn.BatchNorm2d(6, affine=False), (4, 6, 3, 3)),
    "3d-momentum": (lambda: torch.nn.BatchNorm3d(6, momentum=0.3), (2, 6, 2, 3, 3)),
}


@pytest.mark.parametrize("form", FORMS)
def test_training_batch_norm_is_one_node_and_matches_eager(form):
    make, shape = FORMS[form]
    torch.manual_seed(0)
    ref = make()
    with torch.no_grad():
        if ref.affine:
            ref.weight.uniform_(0.5, 1.5)
            ref.bias.uniform_(-0.5, 0.5)
    dev = lazyxla.device()
    lz = copy.deepcopy(ref).to(dev)
    met.clear_counters()
    for step in range(4):
        x = torch.randn(*shape) * 3 + 1
        w = torch.randn(*shape)
        xr, xl = x.clone().requires_grad_(), x.to(dev).requires_grad_()
        yr, yl = ref(xr), lz(xl)
        (yr * w).sum().backward()
        (yl * w.to(dev)).sum().backward()
        lazyxla.sync()
        torch.testing.assert_close(yl.cpu(), yr.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(xl.grad.cpu(), xr.grad, rtol=1e-4, atol=1e-4)
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            torch.testing.assert_close(getattr(lz, name).cpu(), getattr(ref, name), rtol=1e-5, atol=1e-6)
        if ref.affine:
            torch.testing.assert_close(lz.weight.grad.cpu(), ref.weight.grad, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(lz.bias.grad.cpu(), ref.bias.grad, rtol=1e-4, atol=1e-4)
    assert met.counter_value("xla::native_batch_norm") == 4   # one node a step, no decomposition


def test_a_changing_momentum_is_data_not_a_new_program():
    """``momentum=None`` (a cumulative average) gives each step another factor: the same program."""
    dev = lazyxla.device()
    bn = torch.nn.BatchNorm1d(5, momentum=None).to(dev)
    stats = []
    for step in range(4):
        x = torch.randn(7, 5).to(dev)
        bn(x)
        lazyxla.sync()
        stats.append(met.counter_value("UncachedCompile") or 0)
    assert stats[3] == stats[1], stats  # steps 3 and 4 compiled nothing new


def test_half_precision_input_keeps_the_cpus_dtypes():
    torch.manual_seed(0)
    ref = torch.nn.BatchNorm2d(4)
    lz = copy.deepcopy(ref).to(lazyxla.device())
    x = torch.randn(3, 4, 2, 2).to(torch.bfloat16)
    out_r = torch.ops.aten.native_batch_norm(x, ref.weight, ref.bias, ref.running_mean, ref.running_var, True, 0.1, 1e-5)
    out_l = torch.ops.aten.native_batch_norm(x.to(lazyxla.device()), lz.weight, lz.bias, lz.running_mean,
                                             lz.running_var, True, 0.1, 1e-5)
    assert [t.dtype for t in out_l] == [t.dtype for t in out_r] == [torch.bfloat16, torch.float32, torch.float32]
    for a, b in zip(out_l, out_r):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(lz.running_mean.cpu(), ref.running_mean, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(lz.running_var.cpu(), ref.running_var, rtol=1e-3, atol=1e-3)


def test_evaluation_keeps_pytorchs_decomposition():
    torch.manual_seed(0)
    ref = torch.nn.BatchNorm1d(3)
    ref.running_mean.fill_(0.5)
    lz = copy.deepcopy(ref).to(lazyxla.device()).eval()
    ref.eval()
    met.clear_counters()
    x = torch.randn(4, 3)
    torch.testing.assert_close(lz(x.to(lazyxla.device())).cpu(), ref(x), rtol=1e-5, atol=1e-5)
    assert not met.counter_value("xla::native_batch_norm")
