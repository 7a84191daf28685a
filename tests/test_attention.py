"""``F.scaled_dot_product_attention`` as one node forward (``xla::attention``) and one backward
(``xla::attention_backward``): values and gradients equal eager's (PyTorch's own rules: the
causal mask's top-left alignment, boolean and float masks, rows with nothing to attend,
grouped key/value heads, a given scale), and what lazyxla's attention does not compute (dropout,
a mask that needs a gradient, input PyTorch refuses) takes PyTorch's own decomposition, with its
numbers and its errors."""
import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyhelp import cnt, tiny_gpt2_counts
from lazyxla.frontend import attention

DEV = lazyxla.device()
# bf16: the scores round to bf16 before the softmax (as JAX's and XLA's attention), eager's CPU
# kernel keeps them in float32: a gradient's element differs by up to ~3e-2 (12 seeds: 1.3e-2 typical)
TOL = {torch.float32: dict(rtol=2e-5, atol=2e-5), torch.bfloat16: dict(rtol=4e-2, atol=4e-2)}


def _run(dev, q, k, v, mask=None, **kw):
    ins = [t.detach().to(dev).requires_grad_(t.requires_grad) for t in (q, k, v)]
    m = None if mask is None else mask.to(dev)
    out = F.scaled_dot_product_attention(*ins, attn_mask=m, **kw)
    (out.float() * torch.linspace(-1, 1, out.shape[-1]).to(dev)).square().sum().backward()
    return out, [t.grad for t in ins]


def _check(q, k, v, mask=None, fused=True, **kw):
    before = cnt("xla::attention"), cnt("xla::attention_backward")
    got, ggot = _run(DEV, q, k, v, mask, **kw)
    want, gwant = _run("cpu", q, k, v, mask, **kw)
    tol = TOL[q.dtype]
    torch.testing.assert_close(got.cpu(), want, **tol)
    for g, w, name in zip(ggot, gwant, "qkv"):
        torch.testing.assert_close(g.cpu(), w, **tol, msg=lambda m, n=name: f"d{n}: {m}")
    recorded = (cnt("xla::attention") - before[0], cnt("xla::attention_backward") - before[1])
    assert recorded == ((1, 1) if fused else (0, 0)), recorded


def _qkv(shape_q, shape_kv, dtype, shape_v=None):
    g = torch.Generator().manual_seed(hash((shape_q, shape_kv)) % 1000)
    q = torch.randn(*shape_q, generator=g).to(dtype).requires_grad_()
    k = torch.randn(*shape_kv, generator=g).to(dtype).requires_grad_()
    v = torch.randn(*(shape_v or shape_kv), generator=g).to(dtype).requires_grad_()
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", ["plain", "causal", "causal-L<S", "causal-L>S", "scale", "bool-mask",
                                  "float-mask", "masked-rows", "gqa", "no-heads", "v-width"])
def test_values_and_gradients_are_eagers(case, dtype):
    B, H, L, S, E = 2, 3, 9, 9, 8
    kw, mask = {}, None
    if case == "causal-L<S":
        S = 13
    if case == "causal-L>S":
        L = 13
    if case.startswith("causal"):
        kw["is_causal"] = True
    shape_q, shape_kv, shape_v = (B, H, L, E), (B, H, S, E), None
    if case == "scale":
        kw["scale"] = 0.3
    if case == "bool-mask":
        mask = torch.rand(B, 1, L, S, generator=torch.Generator().manual_seed(1)) > 0.3
    if case == "float-mask":
        mask = torch.randn(L, S, generator=torch.Generator().manual_seed(2)).to(dtype)
    if case == "masked-rows":  # rows with nothing to attend: zeros and no gradient, as _safe_softmax
        mask = torch.ones(L, S, dtype=torch.bool)
        mask[2] = False
        mask[5] = False
    if case == "gqa":
        shape_q, shape_kv = (B, 6, L, E), (B, 2, S, E)
        kw["enable_gqa"] = True
    if case == "no-heads":
        shape_q, shape_kv = (L, E), (S, E)
    if case == "v-width":
        shape_v = (B, H, S, 5)
    _check(*_qkv(shape_q, shape_kv, dtype, shape_v), mask, **kw)


def test_dropout_and_a_mask_with_a_gradient_take_pytorchs_decomposition():
    q, k, v = _qkv((2, 2, 5, 4), (2, 2, 5, 4), torch.float32)
    mask = torch.randn(5, 5, requires_grad=True)
    _check(q, k, v, mask, fused=False)
    before = cnt("xla::attention")
    out = F.scaled_dot_product_attention(q.detach().to(DEV), k.detach().to(DEV), v.detach().to(DEV), dropout_p=0.5)
    assert out.shape == (2, 2, 5, 4) and cnt("xla::attention") == before
    lazyxla.sync()


def test_bad_input_raises_pytorchs_error_at_the_users_line():
    q, k, v = (t.detach().to(DEV) for t in _qkv((2, 2, 5, 4), (2, 2, 5, 4), torch.float32))
    # PyTorch's math path refuses a mask beside is_causal (eager's CPU kernel takes it): the same error
    with pytest.raises(RuntimeError, match="Explicit attn_mask should not be set when is_causal=True"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 5, dtype=torch.bool).to(DEV), is_causal=True)
    with pytest.raises(RuntimeError) as eager:
        F.scaled_dot_product_attention(q.cpu(), k[..., :3].cpu(), v.cpu())
    with pytest.raises(RuntimeError) as lazy:
        F.scaled_dot_product_attention(q, k[..., :3], v)  # head sizes differ
    assert str(eager.value) in str(lazy.value) and "test_attention.py:" in str(lazy.value)


def test_switched_off_every_call_takes_the_decomposition(monkeypatch):
    monkeypatch.setattr(attention, "ENABLED", False)
    _check(*_qkv((1, 2, 6, 4), (1, 2, 6, 4), torch.float32), fused=False, is_causal=True)


def test_a_hf_gpt2_trains_like_eager_with_one_attention_node_per_layer():
    assert tiny_gpt2_counts(["xla::attention"], steps=3) == {"xla::attention": 3 * 2}  # 3 steps, 2 layers


def test_a_length_that_varies_runs_padded_programs_with_eagers_values_and_gradients():
    """Attention has a padding rule: query and key lengths padded to their bound, the padded
    keys masked out, so lengths within a bound share one program and give eager's numbers."""
    from lazyxla import dynamic
    dynamic.reset()
    w = torch.randn(8, 8, generator=torch.Generator().manual_seed(5))

    def step(x, dev, causal):
        wd = w.detach().clone().to(dev).requires_grad_()
        q = (x @ wd).view(x.shape[0], x.shape[1], 2, 4).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, q, q, is_causal=causal)
        o.square().sum().backward()
        return o.sum(dim=(1, 3)), wd.grad

    for causal in (True, False):
        before = cnt("UncachedCompile")
        lengths = (5, 6, 7, 8, 6, 5)
        for L in lengths:
            x = torch.randn(2, L, 8, generator=torch.Generator().manual_seed(L))
            got, gw = step(x.to(DEV), DEV, causal)
            lazyxla.sync()  # one program a step; the reads below read its results
            want, ww = step(x, "cpu", causal)
            torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(gw.cpu(), ww, rtol=1e-4, atol=1e-4)
        assert cnt("UncachedCompile") - before <= 3  # the first two lengths exact, then one padded program
