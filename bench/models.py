"""Real models trained with AdamW: eager, lazy, replayed and inductor, step time and peak memory.

Three models, each variant in a new process (eager's OpenMP threads passive):

- ``gpt2``: HF GPT-2 from a config, 4 layers x 256, batch 8 x 128 tokens;
- ``resnet18``: ResNet-18 (torchvision's layout, written here: BasicBlocks 2-2-2-2, 7x7 stem,
  max pool, 1000 classes), batch 16 of 3x64x64;
- ``bert``: HF BERT from a config, 4 layers x 256, batch 8 x 128 tokens, masked-LM loss.

Dropout is off in both HF models, so every variant's loss can be compared with eager's.

Variants: ``eager`` (PyTorch on the CPU), ``lazy`` (lazyxla, ``sync()`` per step), ``replay``
(``lazyxla.compile(step, replay=True)``, AdamW built ``capturable``), ``inductor`` (``torch.compile``),
``floor`` (eager's step in a process that has also imported lazyxla and run one small program on
its device: the memory any variant running XLA in the process starts from, JAX's libraries and
compiler included, before lazyxla holds a byte of the model). Per row: the first
step's seconds (compiles included), a steady step's ms (``--steps`` steps after two of
warm-up, timed together: a lazy step's tracing overlaps the previous step's program), the peak resident memory (MB, ``ru_maxrss``) and the loss after the run, which
must match eager's. Ratios are against eager in the same run.

Usage: python bench/models.py [--models gpt2,resnet18,bert] [--variants eager,lazy,replay,inductor,floor]
       [--steps 10]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def resnet18(num_classes=1000):
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


def make(model_name):
    """(model, a function of the model giving the batch's loss, the batch as CPU tensors)."""
    import torch

    torch.manual_seed(0)
    if model_name == "resnet18":
        model = resnet18()
        batch = (torch.randn(16, 3, 64, 64), torch.randint(0, 1000, (16,)))
        return model, lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y), batch
    ids = torch.randint(0, 1000, (8, 128))
    if model_name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        model = GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=128, n_embd=256, n_layer=4, n_head=4,
                                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                           eos_token_id=0))
    else:
        from transformers import BertConfig, BertForMaskedLM
        model = BertForMaskedLM(BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=4,
                                           num_attention_heads=4, intermediate_size=1024,
                                           max_position_embeddings=128, hidden_dropout_prob=0.0,
                                           attention_probs_dropout_prob=0.0))
    return model, lambda m, x, y: m(input_ids=x, labels=y).loss, (ids, ids.clone())


def job(model_name, variant, steps):
    import torch

    model, loss_of, (x, y) = make(model_name)
    dev = torch.device("cpu")
    if variant == "floor":
        import lazyxla
        z = torch.ones(64, 64, device=lazyxla.device())
        float((z @ z.T).tanh().sum())   # one program compiled and run: XLA's compiler loaded
    if variant in ("lazy", "replay"):
        import lazyxla
        dev = lazyxla.device()
    model = model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=variant == "replay")  # replay: step on the device

    def step(x, y):
        loss = loss_of(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    x, y = x.to(dev), y.to(dev)
    if variant == "inductor":
        run = torch.compile(step)
    elif variant == "replay":
        run = lazyxla.compile(step, replay=True)
    elif variant == "lazy":
        def run(x, y):
            loss = step(x, y)
            lazyxla.sync()
            return loss
    else:
        run = step

    def finish(loss):
        if variant in ("lazy", "replay"):
            lazyxla.wait_device_ops()
        return loss

    t0 = time.perf_counter()
    loss = finish(run(x, y))
    first = time.perf_counter() - t0
    for _ in range(2):
        finish(run(x, y))
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = run(x, y)   # a lazy step's host work overlaps the previous step's program
    finish(loss)
    out = {"first_s": first, "step_ms": (time.perf_counter() - t0) / steps * 1e3}
    if variant in ("lazy", "replay"):
        import lazyxla.debug.metrics as met
        out["compiles"] = met.counter_value("UncachedCompile") or 0
        out["reads"] = met.counter_value("aten::_local_scalar_dense") or 0  # the steps' own, before the loss's
    out["loss"] = float(loss.detach())
    out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="gpt2,resnet18,bert")
    p.add_argument("--variants", default="eager,lazy,replay,inductor")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--job")
    a = p.parse_args()
    if a.job:
        model_name, variant = a.job.split(",")
        return job(model_name, variant, a.steps)
    print(f"{'model':<9} {'variant':<9} {'first s':>8} {'ms/step':>8} {'x eager':>8} {'peak MB':>8} "
          f"{'x eager':>8} {'compiles':>8} {'reads':>6} {'loss':>10}")
    for model_name in a.models.split(","):
        eager = None
        for variant in a.variants.split(","):
            r = subprocess.run([sys.executable, __file__, "--job", f"{model_name},{variant}", "--steps", str(a.steps)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{model_name:<9} {variant:<9} failed: {r.stderr.strip().splitlines()[-1][:100]}")
                continue
            g = json.loads(r.stdout.strip().splitlines()[-1])
            if variant == "eager":
                eager = g
            ratio = f"{g['step_ms'] / eager['step_ms']:.2f}" if eager else "-"
            mem = f"{g['rss_mb'] / eager['rss_mb']:.2f}" if eager else "-"
            print(f"{model_name:<9} {variant:<9} {g['first_s']:>8.2f} {g['step_ms']:>8.1f} {ratio:>8} "
                  f"{g['rss_mb']:>8.0f} {mem:>8} {g.get('compiles', '-'):>8} {g.get('reads', '-'):>6} "
                  f"{g['loss']:>10.6f}", flush=True)


if __name__ == "__main__":
    main()
