"""Workloads whose programs' keys tests/test_cache_keys.py holds against the keys recorded in
``tests/data/cache_keys.json``. Run as ``python cache_keys_job.py`` in a fresh process with
``XLA_PERSISTENT_CACHE_PATH`` set; prints one JSON object: per program in the in-memory cache
(oldest first) its key and its merges (site, ingredient hash), and the entries the persistent
cache wrote. Public API only, so that any tree of lazyxla runs it unchanged:
``python tests/cache_keys_job.py --record`` writes the JSON file anew (see the test's docstring
for when that is right)."""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import lazyxla
import lazyxla.debug as dbg

DEV = lazyxla.device()


def step(model, opt, x, y, loss_fn=F.cross_entropy):
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    lazyxla.sync()
    return loss


def mlp_sgd():
    """SGD with momentum: its first step (state made) and steady steps; then a value read."""
    m = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).to(DEV)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(4, 6).to(DEV), torch.randint(0, 3, (4,)).to(DEV)
    for _ in range(3):
        step(m, opt, x, y)
    m(x).sum().item()  # force_ltc_data false


def deep_adamw():
    """20 alike layers and fused AdamW: parameter stacks, the stacked optimizer step, rolled loops."""
    m = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(20)], nn.Linear(8, 2)).to(DEV)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x, y = torch.randn(4, 8).to(DEV), torch.randint(0, 2, (4,)).to(DEV)
    for _ in range(2):
        step(m, opt, x, y)


def batch_norm_dropout():
    """Batch norm in training (running statistics as one node) and dropout (the seed graph)."""
    m = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Dropout(0.25),
                      nn.Linear(4 * 4 * 4, 3)).to(DEV)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    x, y = torch.randn(2, 2, 6, 6).to(DEV), torch.randint(0, 3, (2,)).to(DEV)
    for _ in range(2):
        step(m, opt, x, y)


def compiled_region():
    """torch.compile(backend="lazyxla"): a region node per call."""
    m = nn.Sequential(nn.Linear(5, 7), nn.GELU(), nn.Linear(7, 2)).to(DEV)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    cm = torch.compile(m, backend="lazyxla")
    x, y = torch.randn(3, 5).to(DEV), torch.randint(0, 2, (3,)).to(DEV)
    for _ in range(2):
        step(cm, opt, x, y)


def scanned_layers():
    """scan_layers: one loop node, its backward a vjp node."""
    layers = nn.ModuleList([nn.Linear(6, 6) for _ in range(3)]).to(DEV)
    x = torch.randn(2, 6).to(DEV)
    out = lazyxla.scan_layers(layers, x)
    out.square().sum().backward()
    lazyxla.sync()


def dynamic_batch():
    """A batch dimension that changes: the third size runs the padded twin."""
    m = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 2)).to(DEV)
    for b in (5, 6, 7):
        x = torch.randn(b, 6).to(DEV)
        out = m(x).softmax(-1).sum(0)
        lazyxla.sync()
        del out


def donated():
    """A buffer the user gives up (the donated parameter indices are a merge of their own)."""
    a = torch.randn(16).to(DEV)
    lazyxla.sync()
    lazyxla.set_buffer_donation(a, True)
    a.mul_(2).add_(1)
    lazyxla.sync()


def gpt2():
    """A small HuggingFace GPT-2 (2 layers, from a config) and AdamW, when transformers is there."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    m = GPT2LMHeadModel(cfg).to(DEV)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (2, 12)).to(DEV)
    for _ in range(2):
        opt.zero_grad()
        m(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        lazyxla.sync()


WORKLOADS = (mlp_sgd, deep_adamw, batch_norm_dropout, compiled_region, scanned_layers, dynamic_batch, donated,
             gpt2)


def main():
    torch.manual_seed(0)
    lazyxla.manual_seed(0)
    for w in WORKLOADS:
        w()
    lazyxla.wait_device_ops()
    programs = [{"key": t.hex, "merges": [[s.site, s.ingredient.hex()] for s in t.steps]}
                for t in dbg.compiled_folds()]
    path = os.environ["XLA_PERSISTENT_CACHE_PATH"]
    entries = sorted(n for n in os.listdir(path) if len(n) == 32 and all(c in "0123456789abcdef" for c in n))
    return {"programs": programs, "entries": entries}


if __name__ == "__main__":
    if "--record" in sys.argv:
        import subprocess
        import tempfile
        here = os.path.dirname(os.path.abspath(__file__))
        with tempfile.TemporaryDirectory() as d:
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("XLA_", "LAZYXLA_", "PT_XLA_", "CPU_NUM_DEVICES", "JAX_"))}
            env.update(XLA_PERSISTENT_CACHE_PATH=os.path.join(d, "cache"), JAX_PLATFORMS="cpu",
                       LAZYXLA_CACHE_HMAC_KEY_FILE=os.path.join(d, "key"))
            os.mkdir(env["XLA_PERSISTENT_CACHE_PATH"], 0o700)
            out = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, check=True)
        got = json.loads(out.stdout.strip().splitlines()[-1])
        got["recorded_by"] = sys.argv[sys.argv.index("--record") + 1] if len(sys.argv) > 2 else ""
        with open(os.path.join(here, "data", "cache_keys.json"), "w") as f:
            json.dump(got, f, indent=1)
            f.write("\n")
    else:
        print(json.dumps(main()))
