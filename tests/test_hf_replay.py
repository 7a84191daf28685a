"""HF GPT-2 and BERT, unchanged, with a padded attention mask, trained with AdamW: replayed
(``lazyxla.compile(step, replay=True)``) and lazily, with eager's losses, and the lazy steps read
no value (transformers' mask checks are told lazy tensors are traced: ``hf_masks``)."""
import pytest
import torch

import lazyxla
from lazyhelp import cnt

transformers = pytest.importorskip("transformers")
DEV = lazyxla.device()
pytestmark = pytest.mark.usefixtures("nothing_pending")


def model_and_loss(kind):
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=96, n_positions=16, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=16, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0)
        model = transformers.BertForMaskedLM(cfg)
    ids = torch.randint(0, 96, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, -3:] = 0  # a padded row: transformers builds (and checks) a padding mask
    return model, ids, mask


def train(kind, way, steps=20):
    model, ids, mask = model_and_loss(kind)
    dev = "cpu" if way == "eager" else DEV
    model = model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=way == "replay")

    def step(ids, mask):
        loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    run = lazyxla.compile(step, replay=True) if way == "replay" else step
    ids, mask = ids.to(dev), mask.to(dev)
    losses, reads = [], cnt("aten::_local_scalar_dense")
    for _ in range(steps):
        loss = run(ids, mask)
        if way == "lazy":
            lazyxla.sync()
        losses.append(loss.detach())
    reads = cnt("aten::_local_scalar_dense") - reads
    return torch.stack([x.cpu() for x in losses]), reads


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_replayed_and_lazy_training_have_eagers_losses_and_read_nothing(kind):
    want, _ = train(kind, "eager")
    got, reads = train(kind, "lazy")
    assert reads == 0  # no padding_mask.all() read in any lazy step
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5)
    before = cnt("UncachedCompile")
    replayed, _ = train(kind, "replay")
    torch.testing.assert_close(replayed, want, rtol=1e-3, atol=1e-5)
    assert cnt("UncachedCompile") - before <= 3  # captured once, not a program per step
    assert want[-1] < want[0] * 0.8  # it learns
