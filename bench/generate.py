"""HuggingFace ``generate`` on lazyxla as users call it, against eager: compiles and time per token.

A 2-layer ``LlamaForCausalLM`` (hidden 64, vocab 256, built from a config: no download), an
8-token prompt, ``cache_implementation="static"``, greedy (``--sample``: temperature 0.8,
top-k 50). Each path and token count runs in a fresh process (so its compiles are its own):
- eager: the model on the CPU, HF's ``generate``;
- lazy: the model on lazyxla, HF's ``generate`` unchanged (its loop never syncs and grows its
  tensors per token: see ``lazyxla/hf.py``);
- lazy+compile: the same with ``model.forward = torch.compile(model.forward, backend="lazyxla")``;
- hf.generate: ``generate(..., custom_generate=lazyxla.hf.generate)``, its per-token step replayed;
- hf.generate+compile: the same with the forward compiled;
- hf.generate traced: ``replay=False``, the step traced and synced per token.
Prints, per path and ``--tokens`` count: the first call (seconds, and programs compiled), a
second call of the same length (programs compiled, ms per new token) and whether the tokens
equal eager's (greedy). Needs ``transformers``. Usage:
python bench/generate.py [--tokens 6,12,32] [--batch 1] [--sample] [--paths ...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

PROMPT = 8
PATHS = ("eager", "lazy", "lazy+compile", "hf.generate", "hf.generate+compile", "hf.generate traced")


def make_model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def prompt(batch):
    """``batch`` prompts; the second one left-padded by 3 tokens (with its attention mask)."""
    import torch
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 256, (batch, PROMPT), generator=g)
    if batch == 1:
        return ids, {}
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0
    return ids, {"attention_mask": mask}


def one(path, n, batch, sample):
    """One path, one token count, in this process: a dict of what was measured."""
    import torch
    kw = {"max_new_tokens": n, "do_sample": sample, "cache_implementation": "static"}
    if sample:
        kw.update(temperature=0.8, top_k=50)
    model = make_model()
    ids, extra = prompt(batch)
    if path != "eager":
        import lazyxla
        import lazyxla.debug.metrics as met
        dev = lazyxla.device()
        model = model.to(dev)
        ids, extra = ids.to(dev), {k: v.to(dev) for k, v in extra.items()}
        if path.endswith("+compile"):
            model.forward = torch.compile(model.forward, backend="lazyxla")
        if path.startswith("hf.generate"):
            kw["custom_generate"] = lazyxla.hf.generate
            if path.endswith("traced"):
                kw["replay"] = False
    compiles = (lambda: met.counter_value("UncachedCompile") or 0) if path != "eager" else (lambda: 0)
    out = {}
    for call in ("first", "second"):
        c0, t0 = compiles(), time.perf_counter()
        with torch.no_grad():
            seq = model.generate(ids, **kw, **extra)
        seq = seq.cpu()
        out[call] = {"s": time.perf_counter() - t0, "compiles": compiles() - c0}
    out["new_tokens"] = seq.shape[1] - PROMPT
    out["tokens"] = seq.tolist()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="6,12,32")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--sample", action="store_true")
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # "path:n": run one in this process, print JSON
    args = ap.parse_args(argv)
    if args.one:
        path, n = args.one.rsplit(":", 1)
        print("JSON" + json.dumps(one(path, int(n), args.batch, args.sample)))
        return
    counts = [int(t) for t in args.tokens.split(",")]
    paths = [p for p in args.paths.split(",") if p in PATHS]
    print(f"HF generate, 2-layer Llama (hidden 64, vocab 256), prompt {PROMPT}, batch {args.batch}, "
          f"{'sampling' if args.sample else 'greedy'}, static cache; each row a fresh process")
    print(f"{'path':22}{'tokens':>7}{'first call s':>14}{'compiles':>10}{'second: compiles':>18}"
          f"{'ms/token':>10}  tokens == eager")
    eager = {}
    for path in ["eager"] + [p for p in paths if p != "eager"]:
        for n in counts:
            cmd = [sys.executable, __file__, "--one", f"{path}:{n}", "--batch", str(args.batch)]
            if args.sample:
                cmd.append("--sample")
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                   env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
            except subprocess.TimeoutExpired:
                print(f"{path:22}{n:>7}  more than {args.timeout:.0f} s")
                continue
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("JSON")]
            if not line:
                print(f"{path:22}{n:>7}  failed: {p.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(line[0][4:])
            if path == "eager":
                eager[n] = r["tokens"]
            same = "-" if args.sample else ("yes" if r["tokens"] == eager.get(n) else "NO")
            per = r["second"]["s"] / max(r["new_tokens"], 1) * 1e3
            print(f"{path:22}{n:>7}{r['first']['s']:14.2f}{r['first']['compiles']:10}{r['second']['compiles']:18}"
                  f"{per:10.2f}  {same}")


if __name__ == "__main__":
    main()
