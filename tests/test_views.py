"""Views and in-place semantics match PyTorch eager, before and after a sync.

A view shares its base's storage: writes through the view show in the base and in every
other view, and writes to the base show in the views, whether the value is still pending IR
or already device data. Each case runs the same function on a CPU tensor and on a lazy one
and compares the base and the returned views, first without a sync (a value read), then
after ``lazyxla.sync()``.
"""
from __future__ import annotations


import pytest
import torch

import lazyxla
from lazyhelp import cnt

DEV = lazyxla.device()

pytestmark = pytest.mark.usefixtures("nothing_pending")


def dev(t):
    return t.to(DEV)


def idx(values, like):
    """An int64 index tensor on like's device."""
    return torch.tensor(values, device=like.device)


def _flat(r):
    if r is None:
        return []
    if isinstance(r, (list, tuple)):
        return [x for y in r for x in _flat(y)]
    return [r]


def check_same(fn, base=None):
    """Run fn on an eager tensor and a lazy copy; compare base and results before/after sync."""
    want_base = (torch.arange(24.0).reshape(4, 6) - 7) if base is None else base.clone()
    got_base = dev(want_base)
    want = _flat(fn(want_base))
    got = _flat(fn(got_base))
    assert len(want) == len(got)
    for phase in ("before sync", "after sync"):
        assert got_base.device == DEV
        torch.testing.assert_close(got_base.cpu(), want_base, rtol=0, atol=0, msg=lambda m: f"{phase}: base: {m}")
        for i, (g, w) in enumerate(zip(got, want)):
            assert g.shape == w.shape and g.dtype == w.dtype, (phase, i)
            torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0, msg=lambda m: f"{phase}: result {i}: {m}")
        lazyxla.sync()


# ---------------------------------------------------------------------------------------
# Slicing and slice assignment.
def _assign_rows(x):
    x[1:3] = 7.0


def _assign_col(x):
    x[:, 0] = 5


def _index_add_inplace(x):
    x[[0, 2]] += 1.5


def _assign_tensor_rows(x):
    x[1:3] = torch.linspace(0, 1, 6, device=x.device)


def _assign_ellipsis(x):
    x[..., 1] *= 3


def _step_slice(x):
    v = x[::2, 1::2]
    v.neg_()
    return v


def _negative_slice(x):
    x[-2:, -3:] = 0.5
    return x[-1]


def _int_then_slice(x):
    row = x[2]
    row[1:4] = -9
    return row


def _copy_into_slice(x):
    x[1:3].copy_(torch.ones(6, device=x.device))


def _copy_broadcast_dtype(x):
    x[0].copy_(torch.arange(6, dtype=torch.int64, device=x.device))


def _flatten_view_write(x):
    x.view(-1)[3:5] = 1


def _assign_bool_mask(x):
    x[x > 5] = 0


def _assign_bool_mask_values(x):
    m = x[:, 0] > 0
    x[m] = torch.full((2, 6), 3.0, device=x.device)


def _assign_bool_mask_columns(x):
    x[:, x[0] > -5] = -1.0
    v = x[1:]
    v[v > 8] *= 0.5
    return v


SLICING = [_assign_rows, _assign_col, _index_add_inplace, _assign_tensor_rows, _assign_ellipsis,
           _step_slice, _negative_slice, _int_then_slice, _copy_into_slice, _copy_broadcast_dtype,
           _flatten_view_write, _assign_bool_mask, _assign_bool_mask_values,
           _assign_bool_mask_columns]


@pytest.mark.parametrize("fn", SLICING, ids=lambda f: f.__name__.strip("_"))
def test_slicing_and_slice_assignment(fn):
    check_same(fn)


def test_bool_mask_read_and_update():
    """``x[mask]`` has a data-dependent shape: it must run (on the CPU, counted as a fallback,
    as torch_xla does), not fail because meta shape inference cannot size it."""
    def fn(x):
        sel = x[x < 0]
        x[x < 0] += 100
        return sel
    check_same(fn)


# ---------------------------------------------------------------------------------------
# View ops: writes through the view reach the base; the view sees later writes to the base.
def _view_of_view(x):
    v = x[1:]
    w = v[:, 2:4]
    w.mul_(2)
    return v, w


def _view_view_chain(x):
    v = x[1]
    w = v[2:]
    w[0] = 9
    return v, w


def _view(x):
    v = x.view(2, 12)
    v[1, 3] = 100
    x[0, 0] = -100
    return v


def _reshape(x):
    r = x.reshape(6, 4)
    r[0, 0] = 42
    return r


def _transpose(x):
    t = x.transpose(0, 1)
    t[1:3, 2:].fill_(-2)
    return t


def _t(x):
    v = x.t()
    v[0] = -1
    return v


def _permute(x):
    p = x.reshape(2, 2, 6).permute(2, 0, 1)
    p[3].zero_()
    return p


def _expand(x):
    e = x[0:1].expand(3, 6)
    x[0, 2] = 55  # the expanded view sees the write
    return e


def _expand_read_after(x):
    e = x[:, :1].expand(4, 3)
    y = e * 2
    x.add_(1)
    return e, y


def _unbind(x):
    a, b, c, d = x.unbind(0)
    c.add_(10)
    return a, d


def _unbind_dim1(x):
    cols = x.unbind(1)
    cols[5].mul_(-1)
    return cols


def _chunk(x):
    cs = x.chunk(3, 1)
    cs[1].fill_(3)
    return cs


def _split(x):
    s = x.split([2, 4], 1)
    s[1][0] += 1
    return s


def _split_size(x):
    s = x.split(3, 0)
    s[1].sub_(5)
    return s


def _narrow(x):
    n = x.narrow(1, 2, 3)
    n.sub_(1)
    return n


def _diagonal(x):
    d = x.diagonal()
    d.fill_(0)
    return d


def _diagonal_offset(x):
    d = x.diagonal(1)
    d += 7
    e = x.diagonal(-1)
    return d, e


def _as_strided(x):
    s = x.as_strided((2, 2), (6, 1), 1)
    s.mul_(0)
    return s


def _unsqueeze_squeeze(x):
    u = x.unsqueeze(0)
    u[0, 1].add_(1)
    s = u.squeeze(0)
    s[2, 2] = -4
    return u, s


def _select_neg(x):
    r = x.select(1, -1)
    r.clamp_(min=0)
    return r


def _unfold(x):
    return x.unfold(1, 2, 2)


def _movedim_flatten(x):
    return x.movedim(0, 1).flatten()


VIEWS = [_view_of_view, _view_view_chain, _view, _reshape, _transpose, _t, _permute, _expand,
         _expand_read_after, _unbind, _unbind_dim1, _chunk, _split, _split_size, _narrow,
         _diagonal, _diagonal_offset, _as_strided, _unsqueeze_squeeze, _select_neg, _unfold,
         _movedim_flatten]


@pytest.mark.parametrize("fn", VIEWS, ids=lambda f: f.__name__.strip("_"))
def test_view_ops(fn):
    check_same(fn)


# ---------------------------------------------------------------------------------------
# Indexed writes.
def _index_put_accumulate_duplicates(x):
    i = idx([0, 0, 1, 3, 0], x)
    x.index_put_((i,), torch.tensor(1.0, device=x.device), accumulate=True)


def _index_put_2d_accumulate(x):
    i, j = idx([0, 0, 1, 1], x), idx([1, 1, 2, 2], x)
    x.index_put_((i, j), torch.tensor([1.0, 2.0, 3.0, 4.0], device=x.device), accumulate=True)


def _index_put_rows(x):
    x.index_put_((idx([3, 1], x),), torch.arange(12.0, device=x.device).reshape(2, 6))


def _index_put_through_view(x):
    v = x[1:]
    v.index_put_((idx([0, 2], x),), torch.tensor(-1.0, device=x.device), accumulate=True)
    return v


def _masked_fill(x):
    x.masked_fill_(x > 10, -3.0)


def _masked_fill_view(x):
    v = x[:, 1:4]
    v.masked_fill_(v.remainder(2) == 0, 0.25)
    return v


def _scatter_gather(x):
    x.scatter_(1, idx([[0], [5], [1], [2]], x), 9.0)
    return torch.gather(x, 1, idx([[0, 1], [5, 5], [1, 0], [2, 3]], x))


def _scatter_src(x):
    src = torch.arange(8.0, device=x.device).reshape(2, 4) * -1
    x.scatter_(0, idx([[1, 2, 3, 0], [0, 0, 2, 1]], x), src)


def _scatter_add(x):
    x.scatter_add_(1, idx([[0, 0, 1], [2, 2, 2], [5, 4, 5], [3, 3, 3]], x),
                   torch.ones(4, 3, device=x.device))


def _index_add(x):
    x.index_add_(0, idx([1, 1, 2], x), torch.ones(3, 6, device=x.device), alpha=2)


def _index_fill_view(x):
    v = x.t()
    v.index_fill_(0, idx([0, 4], x), -8.0)
    return v


def _gather_from_view(x):
    return torch.gather(x.t(), 0, idx([[3, 2, 1, 0]] * 2, x))


INDEXED = [_index_put_accumulate_duplicates, _index_put_2d_accumulate, _index_put_rows, _index_put_through_view,
           _masked_fill, _masked_fill_view, _scatter_gather, _scatter_src, _scatter_add, _index_add,
           _index_fill_view, _gather_from_view]


@pytest.mark.parametrize("fn", INDEXED, ids=lambda f: f.__name__.strip("_"))
def test_indexed_writes(fn):
    check_same(fn)


# ---------------------------------------------------------------------------------------
# Aliases: .data and .detach() share the storage.
def _data_write(x):
    x.data[0] = 3
    return x.data


def _detach_write(x):
    d = x.detach()
    d.add_(1)
    x[3] = 0  # and the other way
    return d


def _detach_view(x):
    d = x.detach()[1:3]
    d.mul_(-1)
    return d


def _data_assign_keeps_alias(x):
    v = x[0]
    x.data.copy_(torch.full((4, 6), 2.0, device=x.device))
    return v


ALIASES = [_data_write, _detach_write, _detach_view, _data_assign_keeps_alias]


@pytest.mark.parametrize("fn", ALIASES, ids=lambda f: f.__name__.strip("_"))
def test_aliases(fn):
    check_same(fn)


def test_data_and_detach_share_storage_with_a_parameter():
    p = torch.nn.Parameter(torch.ones(3, device=DEV))
    p.data.mul_(4)
    d = p.detach()
    d[1] = -1
    assert p.requires_grad and not d.requires_grad
    assert p.cpu().tolist() == [4.0, -1.0, 4.0]
    lazyxla.sync()
    assert p.cpu().tolist() == [4.0, -1.0, 4.0] and d.cpu().tolist() == [4.0, -1.0, 4.0]


def test_clone_does_not_alias():
    x = dev(torch.arange(4.0))
    c = x.clone()
    x.add_(1)
    c[0] = 100
    assert x.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]
    lazyxla.sync()
    assert c.cpu().tolist() == [100.0, 1.0, 2.0, 3.0]


def test_assigning_data_replaces_the_value():
    """``p.data = t`` (weight init, EMA, pruning code) makes p hold t's value."""
    for dev in ("cpu", DEV):
        p = torch.nn.Parameter(torch.zeros(2, 3, device=dev))
        p.data = torch.arange(6.0, device=dev).reshape(2, 3)
        assert p.requires_grad
        assert p.detach().cpu().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], dev
    lazyxla.sync()
    assert p.detach().cpu().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    (p * 2).sum().backward()
    assert p.grad.cpu().tolist() == [[2.0] * 3] * 2


def test_assigning_data_of_another_shape_and_dtype_takes_them():
    """``p.data = p.data.to(torch.bfloat16)`` (casting a model's weights) and pruning to a
    smaller shape work as in PyTorch: the parameter keeps its identity and trains."""
    for dev in ("cpu", DEV):
        p = torch.nn.Parameter(torch.arange(6.0, device=dev).reshape(2, 3))
        p.data = p.data.to(torch.float64)[:, :2]
        assert p.shape == (2, 2) and p.dtype == torch.float64 and p.requires_grad, dev
        (p * 3).sum().backward()
        assert p.detach().cpu().tolist() == [[0.0, 1.0], [3.0, 4.0]], dev
        assert p.grad.cpu().tolist() == [[3.0, 3.0], [3.0, 3.0]] and p.grad.dtype == torch.float64, dev


def test_assigning_a_cpu_tensor_to_data_is_a_clear_error():
    p = torch.nn.Parameter(torch.zeros(2, device=DEV))
    with pytest.raises(RuntimeError, match="only be set to another tensor on lazyxla:0, got one on cpu"):
        p.data = torch.ones(2)


def _t_(x):
    x.t_()
    return x


def _transpose_(x):
    v = x[0]
    x.transpose_(0, 1)
    v.add_(1)
    x[0] = 1
    return x


def _unsqueeze_(x):
    x.unsqueeze_(0)
    return x


def _swapdims_(x):
    x.swapdims_(0, 1)
    return x


def _as_strided_(x):
    x.as_strided_((2, 2), (6, 1))
    return x


def _squeeze_(x):
    x.unsqueeze_(1).squeeze_(1)
    return x


@pytest.mark.parametrize("fn", [_t_, _transpose_, _unsqueeze_, _squeeze_, _swapdims_, _as_strided_],
                         ids=lambda f: f.__name__.strip("_") + "_")
def test_inplace_view_ops_change_the_shape(fn):
    """In-place view ops change the tensor's own shape and strides, and it stays an alias of
    its storage: views taken before see later writes, as in PyTorch."""
    x = dev(torch.arange(24.0).reshape(4, 6))
    assert fn(x) is x
    got = x.cpu()
    want = fn(torch.arange(24.0).reshape(4, 6))
    assert got.shape == want.shape and x.shape == want.shape and x.stride() == want.stride()
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_gradient_flows_through_an_inplace_transpose():
    x = torch.randn(3, 4, requires_grad=True)
    lx = x.detach().to(DEV).requires_grad_()
    y = lx * 2
    y.t_()
    (y * torch.arange(3.0).to(DEV)).sum().backward()
    (x * 2).t().mul(torch.arange(3.0)).sum().backward()
    torch.testing.assert_close(lx.grad.cpu(), x.grad)


@pytest.mark.parametrize("size", [(3, 2), (24,), (5, 6), (0,)], ids=str)
def test_resize_keeps_the_first_elements(size):
    host = torch.arange(24.0).reshape(4, 6)
    x = dev(host)
    x.resize_(*size)
    got = x.cpu()
    assert tuple(got.shape) == size and tuple(x.shape) == size
    n = min(got.numel(), 24)
    assert got.reshape(-1)[:n].tolist() == host.reshape(-1)[:n].tolist()
    assert got.reshape(-1)[n:].tolist() == [0.0] * (got.numel() - n)  # PyTorch leaves these uninitialized
    x.add_(1)  # the resized tensor goes on as any other
    assert x.cpu().reshape(-1)[:n].tolist() == (host.reshape(-1)[:n] + 1).tolist()


def test_resize_as_takes_the_templates_shape():
    x = dev(torch.arange(24.0).reshape(4, 6))
    x.resize_as_(torch.empty(2, 12, device=DEV))
    torch.testing.assert_close(x.cpu(), torch.arange(24.0).reshape(2, 12))


def test_out_tensor_of_another_shape_is_resized_as_pytorch_does():
    a = torch.arange(6.0).reshape(2, 3)
    out = torch.empty(0, device=DEV)
    torch.mul(dev(a), 2, out=out)  # an empty out= is resized silently
    assert out.shape == (2, 3)
    torch.testing.assert_close(out.cpu(), a * 2)
    out = torch.zeros(4, device=DEV)
    with pytest.warns(UserWarning, match=r"resized from \[4\] to \[2, 3\]"):
        torch.add(dev(a), 1, out=out)
    torch.testing.assert_close(out.cpu(), a + 1)


def test_resizing_a_view_is_a_clear_error():
    x = dev(torch.arange(24.0).reshape(4, 6))
    v = x[1:]
    with pytest.raises(lazyxla.LazyXlaError, match="resize_.*cannot resize a view"):
        v.resize_(2, 2)


def test_set_makes_an_alias():
    def fn(x):
        y = torch.zeros_like(x)
        y.set_(x)
        y.add_(1)
        return y
    check_same(fn)


def test_set_to_another_shape_takes_it():
    src = torch.arange(12.0, dtype=torch.float64).reshape(3, 4)
    x = dev(src)
    y = torch.zeros(2, device=DEV, dtype=torch.float64)  # PyTorch's set_ keeps the dtype
    assert y.set_(x) is y
    assert y.shape == (3, 4) and y.stride() == (4, 1)
    y[0] = -1  # an alias: x sees the write
    want = src.clone()
    want[0] = -1
    torch.testing.assert_close(x.cpu(), want)
    torch.testing.assert_close(y.cpu(), want)


# ---------------------------------------------------------------------------------------
# In-place chains across syncs.
def test_inplace_chain_across_syncs():
    want = torch.arange(12.0).reshape(3, 4)
    got = dev(want)
    views = {}
    for t in (want, got):
        v = t[1]
        t.mul_(2)
        views[t.device.type] = [v]
    lazyxla.sync()
    views["lazyxla"][0].add_(1)
    views["cpu"][0].add_(1)
    lazyxla.sync()
    for k, t in (("cpu", want), ("lazyxla", got)):
        views[k].append(views[k][0][1:3])
        t[:, 2] = -1
    lazyxla.sync()
    for k in views:
        views[k][1].mul_(10)
    lazyxla.sync()
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    for g, w in zip(views["lazyxla"], views["cpu"]):
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0)
    # a view made before all that still follows its base
    got.zero_()
    lazyxla.sync()
    assert views["lazyxla"][1].cpu().tolist() == [0.0, 0.0]


def test_view_created_before_sync_is_written_after_it():
    x = dev(torch.zeros(5))
    v = x[2:]
    lazyxla.sync()
    v += 1
    lazyxla.sync()
    v[0] = 7
    assert x.cpu().tolist() == [0.0, 0.0, 7.0, 1.0, 1.0]
    lazyxla.sync()
    assert x.cpu().tolist() == [0.0, 0.0, 7.0, 1.0, 1.0]
    assert v.cpu().tolist() == [7.0, 1.0, 1.0]


def test_read_twice_reflects_everything_done_in_between():
    """SEED's donation counterexample: a read must not consume or advance its source."""
    a = dev(torch.tensor([1.0, 2.0]))
    b = a + 0.9
    a += 0.4
    first = a.cpu()
    second = a.cpu()
    assert str(a) == str(a)
    torch.testing.assert_close(first, torch.tensor([1.4, 2.4]))
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    lazyxla.sync()
    torch.testing.assert_close(a.cpu(), torch.tensor([1.4, 2.4]))  # advanced exactly once
    torch.testing.assert_close(b.cpu(), torch.tensor([1.9, 2.9]))  # b is unaffected
    a += 0.4
    torch.testing.assert_close(b.cpu(), torch.tensor([1.9, 2.9]))
    lazyxla.sync()
    torch.testing.assert_close(a.cpu(), torch.tensor([1.8, 2.8]))


def test_read_between_writes_of_device_data():
    a = dev(torch.tensor([1.0, 2.0]))
    lazyxla.sync()  # a is device data
    b = a * 1  # pending, reads a's old buffer
    a.add_(1)
    assert a.cpu().tolist() == [2.0, 3.0]
    a.add_(1)
    assert a.cpu().tolist() == [3.0, 4.0]
    assert b.cpu().tolist() == [1.0, 2.0]
    lazyxla.sync()
    assert a.cpu().tolist() == [3.0, 4.0] and b.cpu().tolist() == [1.0, 2.0]


def test_inplace_on_view_repeated_in_a_warm_loop_compiles_once():
    x = dev(torch.zeros(4, 4))
    lazyxla.sync()
    counts = []
    for _ in range(4):
        x[1:3, ::2] += 1.5
        x.diagonal().mul_(0.5)
        lazyxla.sync()
        counts.append(cnt("UncachedCompile"))
    assert counts[-1] == counts[1], counts
    want = torch.zeros(4, 4)
    for _ in range(4):
        want[1:3, ::2] += 1.5
        want.diagonal().mul_(0.5)
    torch.testing.assert_close(x.cpu(), want)


# ---------------------------------------------------------------------------------------
# Autograd through views and in-place.
def _grad_fn(a):
    b = a * 2
    b[1:3] += 1
    c = b.t()[2:]
    c.mul_(3)
    return (b ** 2).sum() + b.diagonal().sum() + c.unbind(0)[0].sum()


def test_autograd_through_views_and_inplace():
    torch.manual_seed(0)
    a = torch.randn(4, 5, requires_grad=True)
    al = a.detach().to(DEV).requires_grad_()
    lw = _grad_fn(a)
    lw.backward()
    lg = _grad_fn(al)
    lg.backward()
    torch.testing.assert_close(lg.cpu(), lw.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(al.grad.cpu(), a.grad, rtol=1e-5, atol=1e-5)
    lazyxla.sync()
    torch.testing.assert_close(al.grad.cpu(), a.grad, rtol=1e-5, atol=1e-5)


def test_inplace_on_leaf_view_under_no_grad_then_backward():
    w = torch.nn.Parameter(torch.ones(3, 3))
    wl = torch.nn.Parameter(torch.ones(3, 3, device=DEV))
    for p in (w, wl):
        with torch.no_grad():
            p[0].mul_(3)
            p.diagonal().fill_(0.5)
        (p * p).sum().backward()
    torch.testing.assert_close(wl.grad.cpu(), w.grad)
    torch.testing.assert_close(wl.detach().cpu(), w.detach())


def test_version_counter_error_for_modified_saved_tensor():
    """Autograd's own check fires on the lazy device too (never a silently wrong gradient)."""
    a = torch.ones(3, device=DEV, requires_grad=True)
    b = a.exp()
    b.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        b.sum().backward()


# ---------------------------------------------------------------------------------------
# Unsupported argument combinations raise an error that names the op.
def test_mixed_bool_and_int_index_put_is_an_error_naming_the_op():
    x = dev(torch.zeros(3, 4))
    m = dev(torch.tensor([True, False, True, False]))
    try:
        x[idx([0, 2], x), m] = 1.0
        got = x.cpu()
    except (lazyxla.LazyXlaError, lazyxla.ExecutionError, RuntimeError) as e:
        assert "index_put" in str(e)
        return
    want = torch.zeros(3, 4)
    want[torch.tensor([0, 2]), torch.tensor([True, False, True, False])] = 1.0
    torch.testing.assert_close(got, want)


def test_write_through_a_row_of_an_expanded_tensor_reaches_the_base():
    # the row has no repeated elements, so PyTorch allows it; every row of the expanded view
    # then shows the write (it was scattered level by level before, and lost at the expand)
    def fn(b):
        x = b.expand(2, 3)
        x[0].add_(1)
        return torch.stack([b, x[1]])
    check_same(fn, torch.zeros(3))


def test_fill_of_an_expanded_tensor_fills_the_base():
    def fn(b):
        b.expand(2, 3).fill_(2)
        b.expand(4, 3).zero_()[1].add_(5)
        return b
    check_same(fn, torch.ones(3))


@pytest.mark.parametrize("write", [
    lambda x: x.add_(1), lambda x: x.mul_(2), lambda x: x.copy_(torch.ones(2, 3, device=x.device)),
    lambda x: torch.add(torch.ones(2, 3, device=x.device), 1, out=x),
], ids=["add_", "mul_", "copy_", "out="])
def test_writing_an_expanded_tensor_is_refused_as_in_pytorch(write):
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        write(torch.zeros(3).expand(2, 3))  # eager CPU
    x = torch.zeros(3, device=DEV).expand(2, 3)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor") as ei:
        write(x)
    assert "test_views.py:" in str(ei.value)  # the user's line


# ---------------------------------------------------------------------------------------
# A write through views that move every element once (reshape, t, transpose, permute,
# squeeze/unsqueeze) is the source put back in the base's layout: no scatter in the program.
WHOLE_VIEWS = {
    "t of t": lambda b: b.view(6, 4).t().t(),
    "transpose": lambda b: b.transpose(0, 2),
    "transpose of negative dims": lambda b: b.transpose(-1, -3),
    "permute": lambda b: b.permute(2, 0, 1),
    "permute of a reshape": lambda b: b.reshape(6, 4).t().unsqueeze(0).permute(2, 0, 1),
    "squeeze of unsqueeze": lambda b: b.unsqueeze(1).squeeze(1).flatten(),
    "unflatten": lambda b: b.flatten().unflatten(0, (4, 6)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool], ids=str)
@pytest.mark.parametrize("view", list(WHOLE_VIEWS))
def test_a_write_through_views_that_move_every_element_once_is_no_scatter(view, dtype):
    make = WHOLE_VIEWS[view]

    def write(b):
        v = make(b)
        src = torch.arange(v.numel()).reshape(v.shape) % 5
        v.copy_(src > 2 if dtype == torch.bool else src.to(dtype))
        return b

    base = (torch.arange(24).reshape(2, 3, 4) % 3).to(dtype)
    want = write(base.clone())
    lazy = write(dev(base))
    assert "scatter" not in lazyxla.dump_hlo([lazy])
    assert torch.equal(lazy.cpu(), want)


def test_an_accumulated_weight_gradient_is_added_without_a_scatter():
    lin = torch.nn.Linear(8, 16)
    x = torch.randn(4, 8)
    ll = torch.nn.Linear(8, 16).to(DEV)
    ll.load_state_dict(lin.state_dict())
    for m, inp in ((lin, x), (ll, dev(x))):
        for _ in range(2):  # the second backward adds into .grad, a view (t of t) of the first's product
            m(inp).pow(2).sum().backward()
    assert "scatter" not in lazyxla.dump_hlo([ll.weight.grad])
    torch.testing.assert_close(ll.weight.grad.cpu(), lin.weight.grad, rtol=1e-5, atol=1e-5)
