"""Issue 31, part 2: what the OpInfo run beyond float32 found, as a user meets it.

Descending sorts of bool and unsigned integers, topk's smallest of integers at their extremes,
bool scatters and accumulating index writes, complex Python scalars (hashed like any scalar,
identical across processes), norms' saved statistics in half precision, and the gradients that
fell back or failed. Every case against eager CPU; then ``lazyxla coverage --opinfo`` over the
issue's rows in each mode, so a regression fails here.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyhelp import cnt, in_a_child, on_the_cpu_here
from lazyhelp import needs_wide_int64

DEV = lazyxla.device()

pytestmark = pytest.mark.usefixtures("nothing_pending")

SORTABLE = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]


def _data(dt, shape=(6, 40), seed=0):
    g = torch.Generator().manual_seed(seed)
    if dt == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    info = torch.iinfo(dt)
    x = torch.randint(0, 5, shape, generator=g).to(dt)
    x[0, 0], x[0, 1], x[1, 2], x[2, 3] = info.min, info.max, info.min, info.max
    return x


@pytest.mark.parametrize("stable", [True, False, None])
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dt", SORTABLE, ids=str)
def test_sort_and_argsort_of_integers_and_bools_match_eager(dt, descending, stable):
    needs_wide_int64(dt)
    x = _data(dt)
    kw = {} if stable is None else {"stable": stable}
    v, i = torch.sort(x, dim=1, descending=descending, **kw)
    a = torch.argsort(x, dim=1, descending=descending, **kw)
    lv, li = torch.sort(x.to(DEV), dim=1, descending=descending, **kw)
    la = torch.argsort(x.to(DEV), dim=1, descending=descending, **kw)
    lv, li, la = lv.cpu(), li.cpu(), la.cpu()
    assert torch.equal(lv, v)
    if stable:  # equal elements keep their order: the indices are eager's exactly
        assert torch.equal(li, i) and torch.equal(la, a)
    else:  # PyTorch leaves the order of equal elements open: the indices must pick the values
        for idx in (li, la):
            assert torch.equal(x.gather(1, idx), v)
            assert torch.equal(idx.sort(1).values, torch.arange(x.shape[1]).expand_as(idx))


@pytest.mark.parametrize("dt", SORTABLE[1:] + [torch.float32], ids=str)
def test_topk_smallest_of_integers_at_their_extremes(dt):
    needs_wide_int64(dt)
    x = _data(dt) if dt != torch.float32 else torch.tensor([[3.0, float("nan"), -1.0, float("-inf"), 2.0]])
    for largest in (True, False):
        v, _ = torch.topk(x, 3, dim=1, largest=largest)
        lv, li = torch.topk(x.to(DEV), 3, dim=1, largest=largest)
        torch.testing.assert_close(lv.cpu(), v, equal_nan=True)
        torch.testing.assert_close(x.gather(1, li.cpu()), v, equal_nan=True)


def test_bool_scatters_and_accumulating_writes_match_eager():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 2, (6, 5), generator=g).bool()
    src = torch.randint(0, 2, (6, 5), generator=g).bool()
    idx = torch.randint(0, 6, (6, 5), generator=g)
    rows = torch.tensor([0, 2, 2, 5])
    calls = {
        "scatter_add": lambda t, s, i: t.scatter_add(0, i, s),
        "scatter add": lambda t, s, i: t.scatter(0, i, s, reduce="add"),
        "scatter multiply": lambda t, s, i: t.scatter(0, i, s, reduce="multiply"),
        "scatter_reduce sum": lambda t, s, i: t.scatter_reduce(0, i, s, "sum"),
        "scatter_reduce prod": lambda t, s, i: t.scatter_reduce(0, i, s, "prod", include_self=False),
        "index_add": lambda t, s, i: t.index_add(0, rows.to(t.device), s[:4]),
        "index_put accumulate": lambda t, s, i: t.index_put((rows.to(t.device),), s[:4], accumulate=True),
        "put accumulate": lambda t, s, i: t.put(i[0].to(t.device), s[0], accumulate=True),
    }
    for name, f in calls.items():
        want = f(x, src, idx)
        got = f(x.to(DEV), src.to(DEV), idx.to(DEV)).cpu()
        assert got.dtype == want.dtype and torch.equal(got, want), name


def test_native_dropout_backward_of_a_bool_gradient_is_scaled_as_eager():
    grad = torch.tensor([True, False, True])
    mask = torch.tensor([True, True, False])
    want = torch.ops.aten.native_dropout_backward(grad, mask, 2.0)
    got = torch.ops.aten.native_dropout_backward(grad.to(DEV), mask.to(DEV), 2.0).cpu()
    assert got.dtype == want.dtype and torch.equal(got, want)


# -- complex Python scalars ----------------------------------------------------------------
def test_ops_take_complex_python_scalars():
    g = torch.Generator().manual_seed(2)
    a = torch.randn(3, 3, dtype=torch.complex64, generator=g)
    b = torch.randn(3, 3, dtype=torch.complex64, generator=g)
    w = torch.randn(2, 3, 3, dtype=torch.complex64, generator=g)
    calls = {
        "mul": lambda a, b: a * (2 - 1j),
        "rmul": lambda a, b: (0.5 + 2j) * a,
        "add": lambda a, b: a + 1j,
        "addmm": lambda a, b: torch.addmm(a, a, b, beta=2 + 3j, alpha=1 - 1j),
        "addr": lambda a, b: torch.addr(a, a[0], b[1], beta=2 + 3j, alpha=1j),
        "full": lambda a, b: torch.full((2, 2), 1.5 - 2j, device=a.device),
        "full_like": lambda a, b: torch.full_like(a, 3 + 4j),
        "new_full": lambda a, b: a.new_full((2,), -2j),
        "index_fill": lambda a, b: a.index_fill(0, torch.tensor([1]).to(a.device), 2 + 2j),
        "constant_pad_nd": lambda a, b: torch.constant_pad_nd(a, (1, 1), 2 + 1j),
        "masked_fill": lambda a, b: a.masked_fill(a.real > 0, 7j),
        "conv1d": lambda a, b: F.conv1d(a[None], w.to(a.device)[:, :, :2]) * 1j,
    }
    for name, f in calls.items():
        want = f(a, b)
        got = f(a.to(DEV), b.to(DEV)).cpu()
        assert got.dtype == want.dtype, name
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=name)


def test_a_complex_scalar_is_an_op_value_a_new_one_does_not_compile():
    x = torch.arange(1101.0).to(torch.complex64).to(DEV)  # a length no other test uses
    first = lazyxla.graph_hash([x * (2 + 3j)])
    assert lazyxla.graph_hash([x * (0.5 - 1j)]) == first
    assert lazyxla.graph_hash([x * (1 + 0j)]) != first       # 1 is a special scalar: hashed by value
    y = x * (2 + 3j)
    lazyxla.sync()
    u = cnt("UncachedCompile")
    z = x * (0.5 - 1j)
    lazyxla.sync()
    assert cnt("UncachedCompile") == u
    torch.testing.assert_close(z.cpu(), torch.arange(1101.0).to(torch.complex64) * (0.5 - 1j))
    torch.testing.assert_close(y.cpu(), torch.arange(1101.0).to(torch.complex64) * (2 + 3j))


_COMPLEX_PROGRAM = textwrap.dedent("""
    import json, torch, lazyxla
    x = torch.arange(6.0).to(torch.complex64).to(lazyxla.device())
    print(json.dumps({"value": lazyxla.graph_hash([x * (2 + 3j)]), "special": lazyxla.graph_hash([x + (1 + 0j)]),
                      "param": lazyxla.graph_hash([torch.full((3,), 2 - 1j, device=lazyxla.device())])}))
""")


@in_a_child("keys across processes")
def test_complex_scalar_keys_are_identical_across_processes():
    from lazyhelp import json_here_and_in_a_process
    runs = json_here_and_in_a_process(_COMPLEX_PROGRAM, timeout=240)
    assert runs[0] == runs[1]
    assert all(len(h) == 32 for h in runs[0].values())


# -- norms in half precision ---------------------------------------------------------------
@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16], ids=str)
def test_norm_statistics_have_eagers_dtype_in_half_precision(dt):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 3, 3, generator=g).to(dt)
    w32, w = torch.ones(4), torch.ones(4, dtype=dt)
    calls = {
        "layer_norm": lambda x, w: torch.native_layer_norm(x, [3], None, None, 1e-5),
        "layer_norm float32 weight": lambda x, w: torch.native_layer_norm(x[:, :, :, :1].reshape(2, 4, 3),
                                                                          [3], w[:3].float(), None, 1e-5),
        "batch_norm": lambda x, w: torch.native_batch_norm(x, w, w, None, None, True, 0.1, 1e-5),
        "batch_norm eval": lambda x, w: torch.native_batch_norm(x, w, w, w.clone(), w.clone(), False, 0.1, 1e-5),
        "_native_batch_norm_legit": lambda x, w: torch.ops.aten._native_batch_norm_legit(
            x, w, w, w.clone(), w.clone(), True, 0.1, 1e-5),
        "_batch_norm_with_update": lambda x, w: torch.ops.aten._batch_norm_with_update(
            x, w, w, w.clone(), w.clone(), 0.1, 1e-5)[:3],
        "group_norm": lambda x, w: torch.native_group_norm(x, w, w, 2, 4, 9, 2, 1e-5),
    }
    for wt in (w, w32):
        for name, f in calls.items():
            want = f(x, wt)
            got = [t.cpu() for t in f(x.to(DEV), wt.to(DEV))]
            assert [t.dtype for t in got] == [t.dtype for t in want], (name, wt.dtype)
            assert [t.shape for t in got] == [t.shape for t in want], (name, wt.dtype)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2, msg=name)


def test_a_half_precision_layer_norm_trains_through_its_saved_statistics():
    torch.manual_seed(0)
    ln = torch.nn.LayerNorm(8).to(torch.bfloat16)
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    ln(x).float().square().sum().backward()
    want = ln.weight.grad.clone()
    lz = torch.nn.LayerNorm(8).to(torch.bfloat16)
    lz.load_state_dict(ln.state_dict())
    lz.to(DEV)
    lz(x.to(DEV)).float().square().sum().backward()
    torch.testing.assert_close(lz.weight.grad.cpu(), want, rtol=2e-2, atol=2e-2)


# -- gradients that fell back or failed ----------------------------------------------------
def test_gradients_of_sgn_and_the_shrinks_stay_on_the_device():
    x = torch.tensor([-1.0, -0.2, 0.0, 0.3, 0.5, 2.0])
    for f in (torch.sgn, F.softshrink, F.hardshrink, lambda t: F.softshrink(t, 0.3), lambda t: F.hardshrink(t, 0.5)):
        a = x.clone().requires_grad_()
        f(a).mul(torch.arange(6.0)).sum().backward()
        b = x.to(DEV).requires_grad_()
        before = {k: cnt(k) for k in ("aten::_efficientzerotensor", "aten::softshrink_backward",
                                      "aten::hardshrink_backward")}
        f(b).mul(torch.arange(6.0).to(DEV)).sum().backward()
        assert torch.equal(b.grad.cpu(), a.grad)
        assert {k: cnt(k) for k in before} == before


_POLAR = textwrap.dedent("""
    import json, torch, lazyxla
    a, b = torch.rand(3), torch.rand(3)
    def grads(dev):
        x, y = a.to(dev).requires_grad_(), b.to(dev).requires_grad_()
        out = torch.polar(x, y)
        return [g.cpu().tolist() for g in torch.autograd.grad(out, [x, y], torch.full_like(out, 1 - 2j))]
    print(json.dumps({"eager": grads("cpu"), "lazy": grads(lazyxla.device())}))
""")


@in_a_child("a process that must not abort")
def test_polars_backward_runs_in_a_new_process():
    # its backward multiplies by a complex scalar: before complex scalars were hashed, PyTorch's
    # C++ backward met the error where it cannot pass it on and the process aborted
    r = subprocess.run([sys.executable, "-c", _POLAR], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    torch.testing.assert_close(torch.tensor(got["lazy"]), torch.tensor(got["eager"]), rtol=1e-5, atol=1e-6)


# -- the OpInfo run over the issue's rows, per mode -----------------------------------------
ISSUE_ROWS = {
    "float32-grad": ["polar", "sgn", "fft.hfft", "logcumsumexp", "nn.functional.softshrink",
                     "nn.functional.hardshrink"],
    "bool": ["sort", "argsort", "index_add", "put", "scatter", "scatter_add", "scatter_reduce",
             "index_put", "_unsafe_masked_index_put_accumulate", "native_dropout_backward"],
    "uint8": ["sort", "argsort", "topk"],
    "complex64": ["addmm", "baddbmm", "addbmm", "addr", "logaddexp", "nn.functional.conv1d",
                  "nn.functional.conv_transpose2d", "constant_pad_nd", "index_fill", "full", "full_like",
                  "new_full", "_unsafe_masked_index"],
    "float16": ["native_layer_norm", "native_batch_norm", "_native_batch_norm_legit", "_batch_norm_with_update",
                "matrix_exp", "view_as_complex", "linspace", "renorm", "nn.functional.group_norm"],
    "bfloat16": ["native_layer_norm", "native_batch_norm", "_native_batch_norm_legit", "_batch_norm_with_update",
                 "matrix_exp", "baddbmm", "addmm"],
    "float64": ["special.bessel_j0", "special.bessel_y1", "linalg.eig", "linalg.eigh"],
}


@pytest.mark.parametrize("mode", list(ISSUE_ROWS))
def test_the_issues_opinfo_rows_match_eager(mode):
    from lazyxla.tools import opinfo
    results, _ = opinfo.run(ISSUE_ROWS[mode], mode=mode)
    missing = [w for w in ISSUE_ROWS[mode] if not any(r.name == w or r.name.startswith(w + ".") for r in results)]
    assert not missing, missing  # every row ran (none skipped as random, none without its dtype)
    here = on_the_cpu_here(float64=mode == "float64", float32=mode.startswith("float32"))
    bad = [(r.name, r.status, r.problem, r.counters) for r in results
           if r.status != "ok" and not (r.status == "fallback" and set(r.counters) <= here)]
    assert not bad, bad


def test_cli_runs_a_dtype_and_gradients(tmp_path, capsys):
    from lazyxla import cli
    page = tmp_path / "opinfo_dtypes.md"
    assert cli.main(["coverage", "--opinfo", "--ops", "sort,add", "--dtype", "bool,float32-grad",
                     "--markdown", str(page)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "opinfo bool: 2 ops, 2 ok, 0 fallback (0.0%), 0 wrong, 0 error, 0 refused, 0 no-sample" in out
    assert "opinfo float32-grad: 2 ops, 2 ok, 0 fallback (0.0%), 0 wrong, 0 error, 0 refused, 0 no-sample" in out
    text = page.read_text()
    assert "| bool | 2 | 2 | 0 | 0 | 0 | 0 | 0 |" in text and "| float32-grad | 2 |" in text
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        cli.main(["coverage", "--opinfo", "--ops", "add", "--dtype", "float8"])
