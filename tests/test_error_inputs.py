"""Bad input that eager PyTorch refuses is refused by lazyxla too, when the op is recorded.

Calls whose refusal is decidable from shapes, dtypes and arguments (out= of a dtype the op's
CPU kernel refuses, complex of mixed dtypes, index_add's source shape, masked_scatter's mask,
bucketize's boundaries, a negative convolution padding, uniform_ with from > to,
as_strided_scatter past its storage, multinomial's input, sample count and categories) and
out= tensors that share elements with an input or among themselves (an expanded out=). Each
raises eager's exception type with eager's message, naming the op and the line of the call in
this file; nothing is recorded and every tensor keeps its value. And every error input of
PyTorch's OpInfo database that is decidable while recording raises when recorded.
"""
from __future__ import annotations

import importlib.util
import os
import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyxla.ir import rng
from lazyxla.run import storage

DEV = lazyxla.device()
HERE = os.path.basename(__file__)
pytestmark = pytest.mark.usefixtures("nothing_pending")


def _f(*shape, dtype=torch.float32):
    return lambda dev: torch.randn(*shape, dtype=dtype, device=dev)


# Each case: (id, the op lazyxla names, build(dev) -> (call, tensors the call must leave as they are)).
# The call is a one-line lambda: the line the error must name is the lambda's.
def _amax(dev):
    x, out = torch.randn(20, 20, device=dev), torch.zeros(20, dtype=torch.int32, device=dev)
    return (lambda: torch.amax(x, dim=0, out=out)), [x, out]


def _amin(dev):
    x, out = torch.randn(20, 20, device=dev), torch.zeros(20, dtype=torch.int32, device=dev)
    return (lambda: torch.amin(x, dim=0, out=out)), [x, out]


def _aminmax(dev):
    x = torch.randn(20, 20, device=dev)
    lo, hi = torch.zeros(20, device=dev), torch.zeros(20, dtype=torch.float64, device=dev)
    return (lambda: torch.aminmax(x, dim=0, out=(lo, hi))), [x, lo, hi]


def _gather_dtype(dev):
    src = torch.tensor([[1., 2.], [3., 4.]], device=dev)
    idx, out = torch.tensor([[0, 0], [1, 0]], device=dev), torch.zeros(2, 2, dtype=torch.float64, device=dev)
    return (lambda: torch.gather(src, 1, idx, out=out)), [src, idx, out]


def _add_cast(dev):
    x, out = torch.randn(3, device=dev), torch.zeros(3, dtype=torch.int64, device=dev)
    return (lambda: torch.add(x, x, out=out)), [x, out]


def _cat_cast(dev):
    x, out = torch.randn(2, 3, device=dev), torch.zeros(4, 3, dtype=torch.int64, device=dev)
    return (lambda: torch.cat([x, x], out=out)), [x, out]


def _complex_mixed(dev):
    re_, im = torch.randn(10, 5, device=dev), torch.randn(10, 5, dtype=torch.float64, device=dev)
    return (lambda: torch.complex(re_, im)), [re_, im]


def _complex_out(dev):
    re_, im = torch.randn(10, 5, dtype=torch.float64, device=dev), torch.randn(10, 5, dtype=torch.float64, device=dev)
    out = torch.zeros(10, 5, dtype=torch.complex64, device=dev)
    return (lambda: torch.complex(re_, im, out=out)), [re_, im, out]


def _index_add(dev):
    x, idx, src = torch.randn(3, 2, device=dev), torch.tensor([0, 2], device=dev), torch.randn(2, device=dev)
    return (lambda: torch.index_add(x, 0, idx, src)), [x, idx, src]


def _index_add_(dev):
    x, idx, src = torch.randn(3, 2, device=dev), torch.tensor([0, 2], device=dev), torch.randn(2, device=dev)
    return (lambda: x.index_add_(0, idx, src)), [x, idx, src]


def _masked_scatter(dev):
    x, mask = torch.randn(1, 3, device=dev), torch.ones(1, 3, dtype=torch.uint8, device=dev)
    src = torch.randn(3, 4, device=dev)
    return (lambda: torch.masked_scatter(x, mask, src)), [x, mask, src]


def _bucketize(dev):
    x, b = torch.randn(5, 5, 5, device=dev), torch.randn(5, 5, device=dev)
    return (lambda: torch.bucketize(x, b)), [x, b]


def _conv3d(dev):
    x, w = torch.randn(1, 1, 4, 4, 4, dtype=torch.float64, device=dev), torch.randn(1, 1, 2, 2, 2, dtype=torch.float64,
                                                                                     device=dev)
    b = torch.randn(1, dtype=torch.float64, device=dev)
    return (lambda: F.conv3d(x, w, b, padding=-1)), [x, w, b]


def _uniform(dev):
    x = torch.randn(10, device=dev)
    return (lambda: x.uniform_(3, -1)), [x]


def _as_strided_scatter(dev):
    x, src = torch.randn(4, 4, device=dev), torch.randn(2, 2, device=dev)
    return (lambda: torch.as_strided_scatter(x, src, [2, 2], [200, 200], storage_offset=0)), [x, src]


def _multinomial_int(dev):
    p = torch.ones(1, 2, dtype=torch.int64, device=dev)
    return (lambda: torch.multinomial(p, 2)), [p]


def _multinomial_zero(dev):
    p = torch.ones(2, dtype=torch.float64, device=dev)
    return (lambda: torch.multinomial(p, 0)), [p]


def _multinomial_categories(dev):
    one = torch.ones(1, device=dev)
    p = one.expand(2 ** 24 + 1)  # shape alone decides: no 64 MB needed
    return (lambda: torch.multinomial(p, 3)), [one]


def _multinomial_out(dev):
    p, out = torch.ones(1, 2, dtype=torch.float64, device=dev), torch.zeros(1, 2, dtype=torch.float64, device=dev)
    return (lambda: torch.multinomial(p, 2, out=out)), [p, out]


# out= tensors overlapping an input, or expanded
def _kthvalue_overlap(dev):
    x, idx = torch.randn(10, device=dev), torch.zeros((), dtype=torch.int64, device=dev)
    return (lambda: torch.kthvalue(x, 5, out=(x, idx))), [x, idx]


def _masked_select_overlap(dev):
    y, mask = torch.randn(6, device=dev), torch.tensor([True, False, True, True, False, False], device=dev)
    return (lambda: torch.masked_select(y, mask, out=y)), [y, mask]


def _masked_select_expanded(dev):
    base, y = torch.randn(1, device=dev), torch.randn(6, device=dev)
    mask, out = torch.tensor([True, False, True, True, False, False], device=dev), base.expand(3)
    return (lambda: torch.masked_select(y, mask, out=out)), [base, y, mask]


def _index_select_expanded(dev):
    base, y, ind = torch.randn(1, 6, device=dev), torch.randn(3, 6, device=dev), torch.tensor([0, 1], device=dev)
    out = base.expand(2, 6)
    return (lambda: torch.index_select(y, 1, ind, out=out)), [base, y, ind]


def _index_select_overlap(dev):
    y, ind = torch.randn(6, device=dev), torch.tensor([2, 1, 0, 3, 4, 5], device=dev)
    return (lambda: torch.index_select(y, 0, ind, out=y)), [y, ind]


def _take_overlap(dev):
    src, ind = torch.randn(6, device=dev), torch.tensor([2, 1, 0], device=dev)
    return (lambda: torch.take(src, ind, out=src)), [src, ind]


def _take_index_overlap(dev):
    ind = torch.tensor([2, 1, 0], device=dev)
    src = ind.clone()
    return (lambda: torch.take(src, ind[1:], out=ind[:-1])), [src, ind]


def _take_expanded(dev):
    base, src, ind = torch.randn(1, device=dev), torch.randn(6, device=dev), torch.tensor([2, 1, 0], device=dev)
    out = base.expand(3)
    return (lambda: torch.take(src, ind, out=out)), [base, src, ind]


def _gather_overlap(dev):
    src, ind = torch.randn(6, device=dev), torch.tensor([2, 1, 0], device=dev)
    return (lambda: torch.gather(src, 0, ind, out=src)), [src, ind]


def _gather_index_overlap(dev):
    ind = torch.tensor([2, 1, 0], device=dev)
    src = ind.clone()
    return (lambda: torch.gather(src, 0, ind[1:], out=ind[:1])), [src, ind]  # out= resized onto the index


def _cat_overlap_empty(dev):
    x, y = torch.zeros(0, device=dev), torch.randn(4, 6, device=dev)
    return (lambda: torch.cat((x, y), dim=0, out=x)), [x, y]


def _cat_overlap(dev):
    x, y = torch.zeros(0, device=dev), torch.randn(4, 6, device=dev)
    return (lambda: torch.cat((x, y), dim=0, out=y)), [x, y]


def _cat_overlap_view(dev):
    y, z = torch.randn(4, 6, device=dev), torch.zeros(4, 6, device=dev)
    return (lambda: torch.cat((y, z), out=z[:2, :])), [y, z]


def _add_partial_overlap(dev):
    x = torch.randn(6, device=dev)
    return (lambda: torch.add(x[:5], 1.5, out=x[1:])), [x]


CASES = [
    ("amax out= dtype", "aten::amax.out", _amax),
    ("amin out= dtype", "aten::amin.out", _amin),
    ("aminmax out= dtype", "aten::aminmax.out", _aminmax),
    ("gather out= dtype", "aten::gather.out", _gather_dtype),
    ("add out= cast", "aten::add.out", _add_cast),
    ("cat out= cast", "aten::cat.out", _cat_cast),
    ("complex mixed dtypes", "aten::complex", _complex_mixed),
    ("complex out= dtype", "aten::complex.out", _complex_out),
    ("index_add source shape", "aten::index_add", _index_add),
    ("index_add_ source shape", "aten::index_add_", _index_add_),
    ("masked_scatter byte mask", "aten::masked_scatter", _masked_scatter),
    ("bucketize 2-d boundaries", "aten::bucketize.Tensor", _bucketize),
    ("conv3d negative padding", "aten::convolution", _conv3d),
    ("uniform_ from > to", "aten::uniform_", _uniform),
    ("as_strided_scatter past storage", "aten::as_strided_scatter", _as_strided_scatter),
    ("multinomial integer input", "aten::multinomial", _multinomial_int),
    ("multinomial n_sample 0", "aten::multinomial", _multinomial_zero),
    ("multinomial 2^24+1 categories", "aten::multinomial", _multinomial_categories),
    ("multinomial out= dtype", "aten::multinomial.out", _multinomial_out),
    ("kthvalue out= is the input", "aten::kthvalue.values", _kthvalue_overlap),
    ("masked_select out= is the input", "aten::masked_select.out", _masked_select_overlap),
    ("masked_select out= expanded", "aten::masked_select.out", _masked_select_expanded),
    ("index_select out= expanded", "aten::index_select.out", _index_select_expanded),
    ("index_select out= is the input", "aten::index_select.out", _index_select_overlap),
    ("take out= is the input", "aten::take.out", _take_overlap),
    ("take out= overlaps the index", "aten::take.out", _take_index_overlap),
    ("take out= expanded", "aten::take.out", _take_expanded),
    ("gather out= is the input", "aten::gather.out", _gather_overlap),
    ("gather out= resized over the index", "aten::gather.out", _gather_index_overlap),
    ("cat out= is an empty input", "aten::cat.out", _cat_overlap_empty),
    ("cat out= is an input", "aten::cat.out", _cat_overlap),
    ("cat out= a view of an input", "aten::cat.out", _cat_overlap_view),
    ("add out= partially overlaps", "aten::add.out", _add_partial_overlap),
]


def _eager_error(build):
    torch.manual_seed(0)
    call, _ = build("cpu")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager resizes some out= tensors (with a warning) before refusing
            call()
    except Exception as e:  # noqa: BLE001 - what eager says is the expectation
        return e
    pytest.fail("eager PyTorch accepts this call: not a case of this test")


@pytest.mark.parametrize("op,build", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_when_recorded_with_eagers_error_and_nothing_changes(op, build):
    want = _eager_error(build)
    torch.manual_seed(0)
    call, watched = build(DEV)
    lazyxla.sync()
    before = [t.cpu().clone() for t in watched]
    with pytest.raises(Exception) as ei:
        call()
    e = ei.value
    assert isinstance(e, lazyxla.LazyXlaError) and isinstance(e, type(want)), (type(e), type(want))
    msg, text = str(e), str(want).splitlines()[0]
    assert text in msg, f"eager's message {text!r} not in {msg!r}"
    assert op + ":" in msg, f"{op} not named in {msg!r}"
    line = call.__code__.co_firstlineno
    assert re.search(rf"{re.escape(HERE)}:{line}\b", msg), f"expected {HERE}:{line} in {msg!r}"
    # nothing recorded: no pending value, no random seed drawn
    assert storage.pending()[0] == [] and not rng.pending()
    lazyxla.sync()
    for t, b in zip(watched, before):
        torch.testing.assert_close(t.cpu(), b, rtol=0, atol=0, equal_nan=True)


def test_refused_calls_stay_refused_and_valid_ones_of_the_same_ops_record():
    """A refusal is not remembered as the signature's entry: the same call raises again; the
    same ops with valid arguments record and compute eager's values."""
    x = torch.randn(20, 20)
    lx = x.to(DEV)
    bad = torch.zeros(20, dtype=torch.int32, device=DEV)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="Expected the dtype for input and out to match"):
            torch.amax(lx, dim=0, out=bad)
    good = torch.zeros(20, device=DEV)
    torch.amax(lx, dim=0, out=good)
    src = torch.arange(6.0)
    s = src.to(DEV)
    other = torch.zeros(6, device=DEV)
    torch.take(s, torch.tensor([2, 1, 0], device=DEV), out=other[3:])  # same storage, no shared element
    torch.add(s, 1.0, out=s)  # out= is the input itself: allowed for a pointwise op
    p = torch.ones(2, 3, device=DEV)
    torch.multinomial(p, 2, out=torch.zeros(2, 2, dtype=torch.int64, device=DEV))  # out= and the seed
    torch.testing.assert_close(good.cpu(), x.amax(0))
    torch.testing.assert_close(other.cpu(), torch.tensor([0., 0., 0., 2., 1., 0.]))
    torch.testing.assert_close(s.cpu(), src + 1)


# ---------------------------------------------------------------------------------------
# PyTorch's OpInfo error inputs, through bench/error_inputs.py's runner (aliasing kept).
_VALUE_DEPENDENT = re.compile(r"out of bounds|probability tensor contains|invalid multinomial distribution")


def _runner():
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "error_inputs.py")
    spec = importlib.util.spec_from_file_location("bench_error_inputs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_opinfo_error_inputs_decidable_while_recording_all_raise_when_recorded():
    pytest.importorskip("expecttest")
    bench = _runner()
    late = []
    counted = 0
    for op_i, j, name in bench.cases():
        rec = bench.run_case(op_i, j)
        bench._settle()
        if rec["outcome"] == "eager-accepts" or _VALUE_DEPENDENT.search(rec["expected"]):
            continue  # eager accepts it in this PyTorch; or only the values can tell
        counted += 1
        if rec["outcome"] != "raise" or rec.get("when") not in ("record", "move"):
            late.append(f"{name}({rec['input']}): {rec['outcome']} {rec.get('when', '')} {rec.get('error', '')}")
    assert counted > 600
    assert not late, "\n".join(late)
