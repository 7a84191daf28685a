"""Bounded dynamic shapes: what a padded program costs, and what it saves.

1. ``step``: one training step of a small Transformer encoder (embedding, 2 layers, masked mean
   pool, SGD) at a real length ``--length``, side by side in one process: the exact-shape
   program (dynamic shapes off) and the padded programs (the length padded to the next power
   of two, the program a new size compiles first; and to its own quarter-octave bound, which
   it runs once its padding has paid a compile), all warm; ms per step, median of ``--repeats`` rounds of ``--steps``
   steps, and their ratio. The padded step does the bound's work (``bound / length`` of the
   exact one's) plus the padding of its inputs and the cut of its outputs.
2. ``trainer`` (``--trainer``): ``tests/hf_scripts/padded_trainer.py`` (HF Trainer, tiny BERT,
   DataCollatorWithPadding to the longest; 24 steps, then 80) in new processes: eager, lazyxla with
   ``LAZYXLA_DYNAMIC_BUCKETS=off`` (one program per length, as torch_xla) and lazyxla: programs
   compiled, seconds of the training loop, losses' largest relative difference from eager.
3. ``generate`` (``--generate``): ``lazyxla.hf.generate`` (a 2-layer Llama from a config,
   batch 2 with a left-padded row, 8 new tokens) over 3 and over 9 prompt lengths, each in a
   new process, with prompts padded to their bucket and with ``LAZYXLA_DYNAMIC_BUCKETS=off``:
   programs compiled, seconds, whether every generate's tokens equal eager's.

Usage: python bench/dynamic_shapes.py [--length 40] [--steps 20] [--repeats 5] [--trainer] [--generate]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _model(dev):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    m = torch.nn.ModuleList([torch.nn.Embedding(100, 64), torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                             torch.nn.Linear(64, 3)]).to(dev)
    return m, torch.optim.SGD(m.parameters(), lr=0.01)


def _batch(L, b=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 100, (b, L), generator=g)
    lens = torch.randint(1, L + 1, (b,), generator=g)
    lens[0] = L
    return x, torch.arange(L)[None] < lens[:, None], torch.randint(0, 3, (b,), generator=g)


def _step(m, opt, x, mask, y):
    h = m[1](m[0](x), src_key_padding_mask=~mask)
    loss = torch.nn.functional.cross_entropy(m[2]((h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def step_bench(length, steps, repeats):
    import lazyxla
    from lazyxla import dynamic
    from lazyxla.dynamic import bounds as dyn_bounds
    from lazyxla.engine import executor
    from lazyxla.compiler.cache import computation_cache
    dev = lazyxla.device()
    batch = [t.to(dev) for t in _batch(length)]

    def timed(m, opt):
        for _ in range(3):  # warm: compiled, cached, the optimizer's state made
            _step(m, opt, *batch)
            lazyxla.sync(wait=True)
        rounds = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(steps):
                _step(m, opt, *batch)
                lazyxla.sync()
            lazyxla.wait_device_ops()
            rounds.append((time.perf_counter() - t0) / steps * 1e3)
        return statistics.median(rounds)

    policy, dyn_bounds.POLICY = dyn_bounds.POLICY, "auto"
    own = dynamic.own_bound(length)
    dyn_bounds.POLICY = None            # exact: one program for this length
    exact = timed(*_model(dev))
    got = {}
    for name, bounds in (("first", "pow2"), ("own", (own,))):
        computation_cache().clear()
        executor._TRACES.clear()
        dyn_bounds.POLICY = bounds      # the program a new size compiles first; then the size's own bound
        dynamic.reset()
        m, opt = _model(dev)
        for L in (length - 2, length - 1):  # two other lengths: the dimension becomes dynamic
            _step(m, opt, *[t.to(dev) for t in _batch(L, seed=L)])
            lazyxla.sync(wait=True)
        got[name] = (dynamic.bucket(length), timed(m, opt))
    dyn_bounds.POLICY = policy
    print(f"step at length {length}: exact {exact:.1f} ms")
    for name, what in (("first", "the program a new size compiles first"),
                       ("own", "its own bound, once the padding has paid a compile")):
        b, ms = got[name]
        print(f"  padded to {b} ({what}): {ms:.1f} ms, ratio {ms / exact:.2f} (the bound's share of work: "
              f"{b / length:.2f})")


def trainer_bench():
    sys.path.insert(0, HERE)
    from hf_trainer import run_script
    script = os.path.join(HERE, "..", "tests", "hf_scripts", "padded_trainer.py")
    for sentences, off in (("96", True), ("320", False)):  # 24 and 80 steps; one program per length: 24 only
        rows = {}
        for name, cmd, env in (("eager", [sys.executable, script], {}),
                               ("lazyxla, one program per length", [sys.executable, "-m", "lazyxla", "run", script],
                                {"LAZYXLA_DYNAMIC_BUCKETS": "off"}),
                               ("lazyxla", [sys.executable, "-m", "lazyxla", "run", script], {})):
            if env and not off:
                continue
            rows[name] = run_script(cmd, dict(os.environ, TOKENIZERS_PARALLELISM="false", SENTENCES=sentences,
                                              **env))
        e = rows["eager"]["losses"]
        print(f"HF Trainer, tiny BERT, pad to the longest: {len(e)} steps, {len(rows['eager']['lengths'])} lengths")
        print(f"{'run':<34} {'compiles':>8} {'train s':>8} {'wall s':>7} {'max rel. loss diff':>19}")
        for name, r in rows.items():
            diff = max(abs(r["losses"][k] - v) / abs(v) for k, v in e.items())
            print(f"{name:<34} {str(r['compiles'] if r['compiles'] is not None else '-'):>8} "
                  f"{r['train_seconds']:>8.1f} {r['wall']:>7.1f} {diff:>19.2e}")


def generate_job(lengths):
    """One process's generates at these prompt lengths: prints compiles, seconds, tokens equal."""
    import json
    from transformers import LlamaConfig, LlamaForCausalLM
    import lazyxla
    import lazyxla.debug.metrics as met
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    ref = LlamaForCausalLM(cfg).eval()
    ref.load_state_dict(model.state_dict())
    dev = lazyxla.device()
    model.to(dev)
    equal, lazy_s, eager_s = True, 0.0, 0.0
    for n in lengths:
        ids = torch.randint(3, 256, (2, n), generator=torch.Generator().manual_seed(n))
        mask = torch.ones_like(ids)
        ids[1, :2], mask[1, :2] = 0, 0
        kw = dict(max_new_tokens=8, do_sample=False, cache_implementation="static")
        with torch.no_grad():
            t0 = time.perf_counter()
            got = model.generate(ids.to(dev), attention_mask=mask.to(dev), custom_generate=lazyxla.hf.generate,
                                 **kw).cpu()
            t1 = time.perf_counter()
            want = ref.generate(ids, attention_mask=mask, **kw)
            t2 = time.perf_counter()
        lazy_s, eager_s = lazy_s + t1 - t0, eager_s + t2 - t1
        equal = equal and torch.equal(got, want)
    print(json.dumps({"compiles": met.counter_value("UncachedCompile") or 0, "seconds": lazy_s,
                      "eager_seconds": eager_s, "equal": equal}))


def generate_bench():
    import json
    import subprocess
    print("HF generate (lazyxla.hf.generate), batch 2, 8 new tokens, prompts of 3 and of 9 lengths")
    print(f"{'run':<30} {'lengths':>7} {'compiles':>8} {'lazy s':>7} {'eager s':>7} {'tokens':>7}")
    for name, env in (("one program per length", {"LAZYXLA_DYNAMIC_BUCKETS": "off"}), ("prompt buckets", {})):
        for lengths in ("5,9,13", "5,6,7,8,9,10,11,12,13"):
            r = subprocess.run([sys.executable, __file__, "--generate-job", lengths], capture_output=True, text=True,
                               env=dict(os.environ, **env), check=True)
            got = json.loads(r.stdout.strip().splitlines()[-1])
            print(f"{name:<30} {len(lengths.split(',')):>7} {got['compiles']:>8} {got['seconds']:>7.1f} "
                  f"{got['eager_seconds']:>7.2f} {'equal' if got['equal'] else 'DIFFER':>7}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--length", type=int, default=40)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--trainer", action="store_true", help="also the HF Trainer runs (new processes)")
    p.add_argument("--generate", action="store_true", help="also HF generate over prompt lengths (new processes)")
    p.add_argument("--generate-job", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.generate_job:
        return generate_job([int(n) for n in a.generate_job.split(",")])
    step_bench(a.length, a.steps, a.repeats)
    if a.trainer:
        trainer_bench()
    if a.generate:
        generate_bench()


if __name__ == "__main__":
    main()
