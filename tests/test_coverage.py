"""Core ATen coverage (lazyxla/coverage.py): the classification, a verified subset, and the
data-dependent ops that fall back on purpose."""
import pytest
import torch

import lazyxla
import lazyxla.debug.metrics as met
from lazyxla import coverage

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
