"""One decode step per token: a HuggingFace Llama's decode step replayed, against JAX and eager.

A 2-layer ``LlamaForCausalLM`` (hidden 64, vocab 256, built from a config: no download), a
static KV cache, greedy decoding of ``--tokens`` new tokens after an 8-token prompt. The decode
step (the model's forward for one token at ``cache_position``, the argmax and the next
position) is ``lazyxla.compile(decode, replay=True)``: its program is captured once and
replayed for every token, the token and position fed back as the previous call's outputs.
Prints, in this one run:
- the tokens, which must equal eager PyTorch's greedy tokens;
- the replayed step's compiles for its first tokens and for all later ones (there must be
  none: they do not grow with the token count);
- ms per token: eager PyTorch, lazyxla's lazy path (the same step traced every token), the
  replayed step, and a loop that calls the very same compiled program directly through JAX
  (its outputs fed back as its inputs: the floor for any host). Issue 22's target:
  replay <= 1.5x that loop.
Needs ``transformers`` (``pip install transformers``). Usage: python bench/decode.py [--tokens 32]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

PROMPT = 8


def make_model():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def make_cache(model, device, max_len):
    from transformers import StaticCache
    return StaticCache(config=model.config, max_cache_len=max_len, device=device, dtype=torch.float32)


def prompt_ids():
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, 256, (1, PROMPT), generator=g)


def decode_fn(model, cache):
    def decode(ids, pos):
        out = model(input_ids=ids, cache_position=pos, past_key_values=cache, use_cache=True)
        return out.logits[:, -1].argmax(-1, keepdim=True), pos[-1:] + 1
    return decode


@torch.no_grad()
def run_eager(tokens):
    model = make_model()
    cache = make_cache(model, "cpu", PROMPT + tokens + 1)
    step = decode_fn(model, cache)
    ids, pos = step(prompt_ids(), torch.arange(PROMPT))
    out, times = [int(ids)], []
    for _ in range(tokens - 1):
        t0 = time.perf_counter()
        ids, pos = step(ids, pos)
        out.append(int(ids))
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times) * 1e3


@torch.no_grad()
def run_lazy(tokens, replay):
    import lazyxla
    import lazyxla.debug.metrics as met
    dev = lazyxla.device()
    model = make_model().to(dev)
    cache = make_cache(model, dev, PROMPT + tokens + 1)
    step = decode_fn(model, cache)
    first = lazyxla.compile(step)  # the prompt: a step of its own shape
    each = lazyxla.compile(step, replay=True) if replay else lazyxla.compile(step)
    ids, pos = first(prompt_ids().to(dev), torch.arange(PROMPT).to(dev))
    toks, times, compiles = [ids], [], [met.counter_value("UncachedCompile") or 0]
    for _ in range(tokens - 1):
        t0 = time.perf_counter()
        ids, pos = each(ids, pos)
        toks.append(ids)
        lazyxla.wait_device_ops()
        times.append(time.perf_counter() - t0)
        compiles.append(met.counter_value("UncachedCompile") or 0)
    compiles = (compiles[4] - compiles[0], compiles[-1] - compiles[4])  # tokens 2-5, and every one after
    out = [int(t.item()) for t in toks]
    direct = direct_loop(each, ids, pos, tokens) if replay else None
    return out, statistics.median(times[4:]) * 1e3, compiles, direct


def direct_loop(each, ids, pos, tokens):
    """The replayed step's own compiled program called through JAX, outputs fed back: ms per token."""
    from lazyxla.run.execution import resolve
    import jax
    sig = next(s for s in each._sigs.values() if s.binding is not None)
    b = sig.binding
    args = b.template[:]
    for p, r in zip(b.t_pos, b.t_refs):
        args[p] = resolve(r().data)
    a_pos = dict(zip(b.a_idx, b.a_pos))  # flat argument index -> parameter
    args[a_pos[0]], args[a_pos[1]] = resolve(ids._state.storage.data), resolve(pos._state.storage.data)
    # output index -> the parameter it feeds next: the cache, written in place, and the two arguments
    pos_of = {id(r()): p for p, r in zip(b.t_pos, b.t_refs)}
    back = {k: pos_of[id(r())] for k, r in enumerate(b.o_refs) if r() is not None and id(r()) in pos_of}
    ret = [r[1] for r in sig.outputs if r[0] == "out"]
    back[ret[0]], back[ret[1]] = a_pos[0], a_pos[1]
    ex = b.prog.executable
    times = []
    for _ in range(tokens - 1):
        t0 = time.perf_counter()
        outs = ex(*args)
        for k, p in back.items():
            args[p] = outs[k]
        jax.block_until_ready(outs[ret[0]])
        times.append(time.perf_counter() - t0)
    return statistics.median(times[4:]) * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args(argv)
    want, eager_ms = run_eager(args.tokens)
    rep, rep_ms, rep_compiles, direct_ms = run_lazy(args.tokens, replay=True)  # first: its compiles are its own
    lazy, lazy_ms, lazy_compiles, _ = run_lazy(args.tokens, replay=False)
    print(f"{args.tokens} new tokens, greedy; tokens equal eager's: lazy {lazy == want}, replay {rep == want}")
    print(f"replay's compiles for tokens 2-5 (lazy first call, capture, two checks): {rep_compiles[0]}; "
          f"for the {args.tokens - 5} tokens after them: {rep_compiles[1]}")
    print(f"ms per token (each token waited for): eager {eager_ms:.3f}, lazy {lazy_ms:.3f}, replay {rep_ms:.3f}, "
          f"the same program called directly through JAX {direct_ms:.3f}")
    print(f"replay / direct JAX loop = {rep_ms / direct_ms:.2f} (issue 22's target: <= 1.5); "
          f"replay / eager = {rep_ms / eager_ms:.2f}; lazy / replay = {lazy_ms / rep_ms:.1f}")


if __name__ == "__main__":
    main()
