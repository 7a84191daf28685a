"""The HuggingFace Trainer on eager PyTorch and on lazyxla, steps per second side by side.

The same script (``tests/hf_scripts/trainer_script.py``: a tiny GPT-2 built from a config,
synthetic tokens, transformers' defaults, fused AdamW) runs ``--steps`` training steps, without
evaluation or checkpoints, in a fresh process each: ``python SCRIPT`` (eager) and ``lazyxla run
SCRIPT``. Prints, for each, the whole run's time (the process: imports, model, compiles, steps),
the time of the early steps (2 to ``--warm``, where lazyxla compiles), the steps per second over
the steps after those, and lazyxla's programs compiled. ``--repeats`` interleaved runs, medians. Needs ``transformers``
and ``accelerate``. Usage: python bench/hf_trainer.py [--steps 60] [--warm 10] [--repeats 3]
[--batch 4]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "hf_scripts", "trainer_script.py")


def one(lazy: bool, steps: int, batch: int) -> dict:
    cmd = [sys.executable] + (["-m", "lazyxla", "run"] if lazy else []) + [SCRIPT]
    env = dict(os.environ, STEPS=str(steps), BATCH=str(batch), TOKENIZERS_PARALLELISM="false",
               EXTRA_ARGS=json.dumps({"eval_strategy": "no", "save_strategy": "no", "logging_steps": steps}))
    return run_script(cmd, env)


def run_script(cmd, env) -> dict:
    """Run ``cmd OUT`` (OUT a new folder) with ``env``: the JSON of its last ``RESULT`` line, with
    the process's wall time as ``wall``."""
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        p = subprocess.run(cmd + [out], capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(p.stderr[-2000:])
    r = json.loads(lines[-1][len("RESULT "):])
    r["wall"] = wall
    return r


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warm", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args(argv)
    rows = {"eager": [], "lazyxla": []}
    for _ in range(args.repeats):
        for name in rows:
            r = one(name == "lazyxla", args.steps, args.batch)
            ends = r["step_ends"]
            rate = (len(ends) - args.warm) / (ends[-1] - ends[args.warm - 1])
            rows[name].append({"wall": r["wall"], "rate": rate, "compiles": (r["compiles"] or [0])[-1],
                               "early": ends[args.warm - 1] - ends[0]})
    print(f"HF Trainer, tiny GPT-2 (2 layers, width 32, vocab 128, sequence 16), batch {args.batch}, fused AdamW, "
          f"{args.steps} steps, medians of {args.repeats} interleaved runs")
    print(f"{'':10}{'whole run s':>13}{'steps 2-' + str(args.warm) + ' s':>14}{'steps/s after ' + str(args.warm):>20}"
          f"{'compiles':>10}")
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in rows.items()}
    for name, m in med.items():
        print(f"{name:10}{m['wall']:13.2f}{m['early']:14.2f}{m['rate']:20.1f}{m['compiles']:10.0f}")
    print(f"lazyxla / eager steps per second: {med['lazyxla']['rate'] / med['eager']['rate']:.2f}")


if __name__ == "__main__":
    main()
