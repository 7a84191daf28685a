"""Core ATen coverage (lazyxla/tools/coverage/): the classification, a verified subset, and the
data-dependent ops that fall back on purpose."""
import pytest
import torch

import lazyxla
import lazyxla.debug.metrics as met
from lazyxla.tools import coverage

aten = torch.ops.aten

# One or two ops of each family, the ops lowered in lowering/{distance,fft,indexing,embedding,pooling}.py, composites and
# decompositions; with the OpInfos whose samples reach them.
SUBSET = [
    aten.add.Tensor, aten.mul.Scalar, aten.div.Tensor_mode, aten.where.self, aten.clamp.Tensor,
    aten.pow.Tensor_Tensor, aten.sum.dim_IntList, aten.amax.default, aten.argmax.default,
    aten.cumsum.default, aten.addmm.default, aten.bmm.default, aten.convolution.default,
    aten.convolution_backward.default, aten.max_pool2d_with_indices.default, aten.avg_pool3d.default,
    aten._adaptive_avg_pool3d.default, aten._softmax.default, aten.native_layer_norm.default,
    aten._native_batch_norm_legit_no_training.default, aten.embedding.default,
    aten._embedding_bag.default, aten.gather.default, aten.scatter_reduce.two,
    aten.masked_scatter.default, aten.index_put.default, aten.cat.default, aten.permute.default,
    aten._cdist_forward.default, aten._pdist_forward.default, aten._fft_r2c.default,
    aten._fft_c2r.default, aten.sort.default, aten.topk.default, aten.var.dim,
    aten.upsample_bilinear2d.vec, aten.reflection_pad2d.default, aten.native_group_norm.default,
    aten.sym_size.int, aten.nonzero.default,
]
OPINFOS = [
    "add", "mul", "div.floor_rounding", "where", "clamp", "pow", "sum", "amax", "argmax", "cumsum",
    "addmm", "bmm", "nn.functional.conv2d", "nn.functional.max_pool2d", "nn.functional.avg_pool3d",
    "nn.functional.adaptive_avg_pool3d", "softmax", "nn.functional.layer_norm",
    "nn.functional.embedding", "nn.functional.embedding_bag", "gather", "scatter_reduce.sum",
    "scatter_reduce.amax", "masked_scatter", "index_put", "cat", "permute", "cdist",
    "nn.functional.pdist", "fft.rfft", "fft.irfft", "sort", "topk", "nn.functional.group_norm",
    "nonzero", "var", "nn.functional.interpolate.bilinear",
]


def test_fallback_share_at_most_5_percent():
    classes = coverage.classification()
    assert len(classes) > 150  # the core op set was found
    share = coverage.fallback_share(classes)
    fallbacks = sorted(coverage.op_name(op) for op, (cat, _) in classes.items() if cat == "fallback")
    assert share <= 0.05, f"{100 * share:.1f}% of core ops fall back: {fallbacks}"
    # what is left falls back on purpose
    assert {n.split(".")[0] for n in fallbacks} <= coverage.EXPECTED_FALLBACK, fallbacks


def test_classification_follows_dispatch_order():
    assert coverage.classify(aten.add.Tensor)[0] == "lowered"
    assert coverage.classify(aten.atan2.out)[0] == "lowered"  # through its functional op
    assert coverage.classify(aten.upsample_bilinear2d.vec)[0] == "composite"
    assert coverage.classify(aten.col2im.default)[0] == "decomposed"
    assert coverage.classify(aten.nonzero.default)[0] == "fallback"


def test_verified_subset_runs_without_errors_or_unexpected_fallbacks():
    result = coverage.verify(SUBSET, per_op=2, opinfos=OPINFOS, time_budget=40)
    bad = {coverage.op_name(op): (r.status, r.detail) for op, r in result.items()
           if r.status in ("error", "no-sample")}
    assert not bad, bad
    fallbacks = {coverage.op_name(op) for op, r in result.items() if r.status == "fallback"}
    assert fallbacks == {"nonzero"}, fallbacks
    assert result[aten.nonzero.default].counters == ("aten::nonzero",)


def test_nonzero_falls_back_with_its_counter():
    dev = lazyxla.device()
    x = torch.tensor([[0.0, 1.5], [2.0, 0.0], [0.0, -3.0]])
    before = met.counter_value("aten::nonzero") or 0
    got = torch.nonzero(x.to(dev))
    assert met.counter_value("aten::nonzero") == before + 1
    assert got.device == dev
    torch.testing.assert_close(got.cpu(), torch.nonzero(x))


def test_boolean_mask_index_falls_back_with_its_counter():
    dev = lazyxla.device()
    x = torch.arange(12.0).reshape(4, 3)
    m = torch.tensor([True, False, True, True])
    before = met.counter_value("aten::index") or 0
    got = x.to(dev)[m.to(dev)]
    assert met.counter_value("aten::index") == before + 1
    torch.testing.assert_close(got.cpu(), x[m])


def test_cli_writes_the_table(tmp_path):
    from lazyxla import cli
    out = tmp_path / "coverage.md"
    assert cli.main(["coverage", "--markdown", str(out)]) == 0
    text = out.read_text()
    assert "| `add.Tensor` | lowered |" in text
    assert "core ATen ops:" in text


# ---------------------------------------------------------------------------------------
# lazyxla coverage --opinfo (lazyxla/tools/opinfo/): whole OpInfos on the lazy device.
TOTALS = (r"^opinfo: (\d+) ops, (\d+) ok, (\d+) fallback \((\d+\.\d)%\), (\d+) wrong, (\d+) error, "
          r"(\d+) refused, (\d+) no-sample$")


def test_opinfo_runner_classifies_what_a_user_sees():
    import re
    from lazyxla.tools import opinfo
    results, excluded = opinfo.run(["add", "mm", "nonzero", "equal", "bernoulli"])
    by = {r.name: r for r in results}
    assert sorted(by) == ["add", "equal", "mm", "nonzero"]
    assert excluded == {"bernoulli": "random (by name)"}
    assert (by["add"].status, by["add"].counters, by["add"].samples) == ("ok", {}, 3)
    assert by["mm"].status == "ok"
    # value-dependent: stays on the CPU, with the counters that moved
    assert by["nonzero"].status == "fallback" and by["nonzero"].counters == {"aten::nonzero": 3}
    assert by["equal"].status == "fallback" and by["equal"].counters  # a bool: the value goes to the host
    line = opinfo.totals_line(results)
    assert line == "opinfo: 4 ops, 2 ok, 2 fallback (50.0%), 0 wrong, 0 error, 0 refused, 0 no-sample"
    assert re.match(TOTALS, line)
    assert opinfo.by_counter(results)["aten::nonzero"] == ["nonzero"]


class _FakeOpInfo:
    """Just enough of an OpInfo for check_opinfo: a name, samples and a call."""

    def __init__(self, name, fn, n=2):
        self.name, self.variant_test_name, self.fn, self.n = name, "", fn, n

    def sample_inputs(self, device, dtype, requires_grad=False):
        from torch.testing._internal.opinfo.core import SampleInput
        return (SampleInput(torch.arange(4.0, dtype=dtype) + i) for i in range(self.n))

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def test_opinfo_runner_wrong_error_no_sample_and_time_limit():
    import time
    from lazyxla.tools import opinfo

    def differs(x):  # a different value on the lazy device: wrong
        return x + (1.0 if x.device.type != "cpu" else 0.0)

    def raises(x):  # lazy raises where eager does not: error
        if x.device.type != "cpu":
            raise RuntimeError("no lowering")
        return x

    def rejects(x):  # eager rejects every sample: no-sample
        raise ValueError("not a sample")

    def slow(x):
        time.sleep(30)
        return x

    check = opinfo.check_opinfo
    wrong = check(_FakeOpInfo("differs", differs))
    assert wrong.status == "wrong" and wrong.problem.startswith("output 0: Tensor-likes are not close"), wrong
    error = check(_FakeOpInfo("raises", raises))
    assert (error.status, error.problem, error.samples) == ("error", "RuntimeError: no lowering", 2)
    assert check(_FakeOpInfo("rejects", rejects)).status == "no-sample"
    t0 = time.monotonic()
    timed = check(_FakeOpInfo("slow", slow), time_limit=0.5)
    assert timed.status == "error" and timed.problem.startswith("time limit: over 0.5 s"), timed
    assert time.monotonic() - t0 < 5
    ok = check(_FakeOpInfo("same", lambda x: (x * 2).sum() > 0, n=1))  # a tensor of a bool
    assert ok.status == "ok"
    line = opinfo.totals_line([wrong, error, ok])
    assert line == "opinfo: 3 ops, 1 ok, 0 fallback (0.0%), 1 wrong, 1 error, 0 refused, 0 no-sample"


def test_cli_opinfo_prints_totals_and_writes_json(tmp_path, capsys):
    import json
    import re
    from lazyxla import cli
    out = tmp_path / "opinfo.json"
    page = tmp_path / "opinfo.md"
    assert cli.main(["coverage", "--opinfo", "--ops", "add,nonzero", "--json", str(out),
                     "--markdown", str(page)]) == 0
    stdout = capsys.readouterr().out.splitlines()
    assert re.match(TOTALS, stdout[-1]), stdout[-1]
    assert stdout[-1] == "opinfo: 2 ops, 1 ok, 1 fallback (50.0%), 0 wrong, 0 error, 0 refused, 0 no-sample"
    records = {r["name"]: r for r in json.loads(out.read_text())["ops"]}
    assert records["nonzero"]["status"] == "fallback"
    assert records["nonzero"]["counters"] == {"aten::nonzero": 3}
    assert records["add"] == {**records["add"], "status": "ok", "counters": {}, "problem": ""}
    assert "| `aten::nonzero` | output shape is the number of nonzero elements | `nonzero` |" in page.read_text()
