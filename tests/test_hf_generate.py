"""HuggingFace ``generate`` on the lazy device through ``custom_generate=lazyxla.hf.generate``:
the tokens are eager's, the compiles do not grow with the number of new tokens, and a second
generate of the same lengths compiles nothing (a 2-layer Llama built from a config)."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import lazyxla
from lazyxla.errors import LazyXlaError
from lazyhelp import cnt

pytestmark = pytest.mark.usefixtures("nothing_pending")
PROMPT = 8


def make_model():
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def prompt(batch=1):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 256, (batch, PROMPT), generator=g)
    if batch == 1:
        return ids, {}
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0  # the second prompt left-padded
    return ids, {"attention_mask": mask}


def run(model, ids, extra, **kw):
    """(tokens as a CPU tensor, programs compiled) of one generate on the lazy device."""
    before = cnt("UncachedCompile")
    dev = lazyxla.device()
    with torch.no_grad():
        out = model.generate(ids.to(dev), cache_implementation="static", custom_generate=lazyxla.hf.generate,
                             **{k: v.to(dev) for k, v in extra.items()}, **kw)
    seq = (out.sequences if hasattr(out, "sequences") else out).cpu()
    return seq, cnt("UncachedCompile") - before


def eager(ids, extra, **kw):
    with torch.no_grad():
        return make_model().generate(ids, cache_implementation="static", **extra, **kw)


@pytest.mark.parametrize("batch,compiled", [(1, False), (2, True)], ids=["1-lazy", "2-compiled-forward"])
def test_greedy_is_eagers_and_compiles_do_not_grow_with_the_tokens(batch, compiled):
    model = make_model().to(lazyxla.device())
    if compiled:
        model.forward = torch.compile(model.forward, backend="lazyxla")
    ids, extra = prompt(batch)
    runs = {}
    for n in (6, 12, 20):  # sequences of 14, 20 and 28: caches of 16, 32 and 32 (their buckets)
        seq, compiles = run(model, ids, extra, max_new_tokens=n, do_sample=False)
        assert torch.equal(seq, eager(ids, extra, max_new_tokens=n, do_sample=False)), n
        assert seq.shape == (batch, PROMPT + n)
        runs[n] = compiles
    assert runs[12] <= runs[6] and runs[12] <= 4, runs  # a new cache: its zeros, the prompt and the step
    assert runs[20] == 0, runs  # more tokens within the cache's bucket: its programs


def prompts(lengths, batch=2):
    """Prompts of the given lengths, the second of each batch left-padded by two."""
    out = []
    for n in lengths:
        ids = torch.randint(3, 256, (batch, n), generator=torch.Generator().manual_seed(n))
        mask = torch.ones_like(ids)
        ids[1, :2], mask[1, :2] = 0, 0
        out.append((ids, {"attention_mask": mask}))
    return out


def test_prompts_of_three_times_the_lengths_compile_nothing_more_and_give_eagers_tokens():
    kw = dict(max_new_tokens=4, do_sample=False)
    three = make_model().to(lazyxla.device())
    compiles = []
    for ids, extra in prompts((5, 9, 13)):
        seq, c = run(three, ids, extra, **kw)
        assert torch.equal(seq, eager(ids, extra, **kw)), ids.shape
        compiles.append(c)
    # (prompt, cache) buckets (8, 16), (16, 16), (16, 32): after the first generate (HF's own
    # checks too), at most the cache's zeros, the prompt's program and the token's
    assert compiles[1] <= 3 and compiles[2] <= 3, compiles
    captures = cnt("GraphCapture")
    (ids, extra), = prompts((11,))  # the same model, a new length within (16, 32): its step replays
    seq, c = run(three, ids, extra, **kw)
    assert c == 0 and cnt("GraphCapture") == captures and torch.equal(seq, eager(ids, extra, **kw))
    # another model of the same kind, every length from 5 to 13: the programs of the three above
    nine = make_model().to(lazyxla.device())
    answered = cnt("HostAnsweredRead")
    for ids, extra in prompts(range(5, 14)):
        seq, c = run(nine, ids, extra, **kw)
        assert c == 0, (ids.shape, c)
        assert torch.equal(seq, eager(ids, extra, **kw)), ids.shape
    assert cnt("HostAnsweredRead") > answered  # HF's preparations for a prompt: on the host


def test_a_second_generate_replays_the_step_it_captured_before():
    model = make_model().to(lazyxla.device())
    ids, extra = prompt()
    run(model, ids, extra, max_new_tokens=10, do_sample=False)
    captures, replays = cnt("GraphCapture"), cnt("GraphReplay")
    seq, compiles = run(model, ids, extra, max_new_tokens=10, do_sample=False)
    assert compiles == 0 and cnt("GraphCapture") == captures
    assert cnt("GraphReplay") - replays == 9  # every token after the prompt's
    assert torch.equal(seq, eager(ids, extra, max_new_tokens=10, do_sample=False))


def test_sampling_draws_from_the_seed_and_compiles_do_not_grow():
    model = make_model().to(lazyxla.device())
    ids, extra = prompt(2)
    kw = dict(do_sample=True, temperature=0.8, top_k=50)
    lazyxla.manual_seed(5)
    first, _ = run(model, ids, extra, max_new_tokens=10, **kw)
    lazyxla.manual_seed(5)
    again, compiles = run(model, ids, extra, max_new_tokens=10, **kw)
    assert compiles == 0
    assert torch.equal(first, again)  # the same seed, the same tokens (lazy, captured or replayed)
    lazyxla.manual_seed(6)
    other, _ = run(model, ids, extra, max_new_tokens=10, **kw)
    assert not torch.equal(first, other)
    assert torch.equal(first[:, :PROMPT], ids)
    assert int(first.min()) >= 0 and int(first.max()) < 256
    _, c21 = run(model, ids, extra, max_new_tokens=21, **kw)  # a sequence of 29: the cache of 32 above
    _, c27 = run(model, ids, extra, max_new_tokens=27, **kw)  # 35: a cache of 64
    assert c21 == 0 and c27 <= 4, (c21, c27)


def test_traced_every_token_gives_the_same_tokens():
    model = make_model().to(lazyxla.device())
    ids, extra = prompt(2)
    seq, _ = run(model, ids, extra, max_new_tokens=8, do_sample=False, replay=False)
    assert torch.equal(seq, eager(ids, extra, max_new_tokens=8, do_sample=False))
    _, c13 = run(model, ids, extra, max_new_tokens=13, do_sample=False, replay=False)
    _, c15 = run(model, ids, extra, max_new_tokens=15, do_sample=False, replay=False)
    assert c13 <= 4 and c15 == 0, (c13, c15)  # sequences of 21 and 23: one cache bucket (32)


def test_a_processor_that_reads_the_sequence_gets_it_exactly():
    model = make_model().to(lazyxla.device())
    ids, extra = prompt()
    kw = dict(max_new_tokens=8, do_sample=False, repetition_penalty=1.5)
    seq, _ = run(model, ids, extra, **kw)
    assert torch.equal(seq, eager(ids, extra, **kw))


def test_scores_and_logits_as_eager():
    model = make_model().to(lazyxla.device())
    ids, extra = prompt()
    kw = dict(max_new_tokens=5, do_sample=False, return_dict_in_generate=True, output_scores=True,
              output_logits=True)
    dev = lazyxla.device()
    with torch.no_grad():
        out = model.generate(ids.to(dev), cache_implementation="static", custom_generate=lazyxla.hf.generate, **kw)
    ref = eager(ids, extra, **kw)
    assert torch.equal(out.sequences.cpu(), ref.sequences)
    assert len(out.scores) == len(ref.scores) == 5 and len(out.logits) == 5
    for a, b in zip(out.scores + out.logits, ref.scores + ref.logits):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-4)


def test_what_it_cannot_do_is_refused_with_the_way_that_works():
    model = make_model().to(lazyxla.device())
    ids, extra = prompt()
    with pytest.raises(LazyXlaError, match=r"num_beams=1.*num_beams=2"):
        run(model, ids, extra, max_new_tokens=4, num_beams=2)
    with torch.no_grad(), pytest.raises(LazyXlaError, match=r"static cache.*DynamicCache.*cache_implementation"):
        model.generate(ids.to(lazyxla.device()), max_new_tokens=4, custom_generate=lazyxla.hf.generate)


def test_a_model_on_the_cpu_runs_hfs_own_loop():
    ids, extra = prompt()
    with torch.no_grad():
        out = make_model().generate(ids, max_new_tokens=6, cache_implementation="static",
                                    custom_generate=lazyxla.hf.generate)
    assert out.device.type == "cpu"
    assert torch.equal(out, eager(ids, extra, max_new_tokens=6))
