"""A plain accelerate training loop of a tiny GPT-2 built from a config (no download), nothing
XLA-specific: ``Accelerator().prepare``, ``backward``, ``clip_grad_norm_``, ``gather``, an evaluation
every 6 steps with ``gather_for_metrics``, ``save_state`` there, ``load_state`` and
``skip_first_batches`` to resume. Run as ``python accelerate_script.py OUT`` or under ``lazyxla run``.
Environment: STEPS (12), BATCH (4), RESUME (a state directory). Prints ``RESULT`` and JSON as
trainer_script.py does."""
import json
import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator
from accelerate.utils import set_seed
from transformers import GPT2Config, GPT2LMHeadModel

out = sys.argv[1]
steps = int(os.environ.get("STEPS", "12"))
batch = int(os.environ.get("BATCH", "4"))
resume = os.environ.get("RESUME") or None


class Tokens(Dataset):
    def __init__(self, n, seq=16, vocab=128, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


set_seed(0)
acc = Accelerator()
cfg = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                 attn_pdrop=0.0)
model = GPT2LMHeadModel(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
train = DataLoader(Tokens(64), batch_size=batch, shuffle=False)
evals = DataLoader(Tokens(16, seed=1), batch_size=4)
model, opt, train, evals = acc.prepare(model, opt, train, evals)
start = 0
if resume:
    acc.load_state(resume)
    start = int(open(os.path.join(resume, "step.txt")).read())
    train = acc.skip_first_batches(train, start)
losses, evaluated, compiles = {}, {}, []
step = start
for b in train:
    model.train()
    loss = model(**b).loss
    acc.backward(loss)
    acc.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    step += 1
    losses[step] = acc.gather(loss.detach()).mean().item()
    if step % 6 == 0:
        model.eval()
        with torch.no_grad():
            ev = [acc.gather_for_metrics(model(**e).loss.detach().reshape(1)) for e in evals]
        evaluated[step] = torch.cat(ev).mean().item()
        acc.save_state(os.path.join(out, f"state-{step}"))
        if acc.is_main_process:
            open(os.path.join(out, f"state-{step}", "step.txt"), "w").write(str(step))
    try:
        import torch_xla.debug.metrics as met
        compiles.append(met.counter_value("UncachedCompile") or 0)
    except ImportError:
        pass
    if step >= steps:
        break
if acc.is_main_process:
    print("RESULT " + json.dumps({"losses": losses, "eval": evaluated, "device": str(acc.device),
                                  "world": acc.num_processes, "compiles": compiles}))
