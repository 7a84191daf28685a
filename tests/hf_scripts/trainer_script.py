"""A plain HuggingFace Trainer fine-tune of a tiny GPT-2 built from a config (no download), on synthetic
tokens, with transformers' defaults (fused AdamW included): nothing XLA-specific. Run as ``python
trainer_script.py OUT`` (eager) or ``lazyxla run trainer_script.py OUT``. Environment: STEPS (12), BATCH
(per device, 4), RESUME (a checkpoint directory), EXTRA_ARGS (JSON: more TrainingArguments). Prints
``RESULT`` and JSON: the logged losses by step, the evaluation losses, the device, the optimizer, the
number of processes, when each step ended and (through torch_xla's metrics, when a torch_xla is there)
the programs compiled by then."""
import json
import os
import sys
import time

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments, set_seed

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


class Steps(TrainerCallback):
    """When each step ended, and (through torch_xla's metrics, when a torch_xla is there: none on
    eager) how many programs had compiled by then."""
    ends, compiles = [], []

    def on_step_end(self, args, state, control, **kw):
        self.ends.append(time.perf_counter())
        try:
            import torch_xla.debug.metrics as met
        except ImportError:
            return
        self.compiles.append(met.counter_value("UncachedCompile") or 0)


set_seed(0)
cfg = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                 attn_pdrop=0.0)
model = GPT2LMHeadModel(cfg)
settings = dict(output_dir=out, max_steps=steps, per_device_train_batch_size=batch, per_device_eval_batch_size=4,
                logging_steps=1, eval_strategy="steps", eval_steps=6, save_steps=6, report_to=[], seed=0,
                learning_rate=1e-3)
settings.update(json.loads(os.environ.get("EXTRA_ARGS", "{}")))
args = TrainingArguments(**settings)
trainer = Trainer(model=model, args=args, train_dataset=Tokens(64), eval_dataset=Tokens(16, seed=1),
                  callbacks=[Steps()])
trainer.train(resume_from_checkpoint=resume)
hist = trainer.state.log_history
if trainer.is_world_process_zero():
    print("RESULT " + json.dumps({
        "losses": {h["step"]: h["loss"] for h in hist if "loss" in h},
        "eval": {h["step"]: h["eval_loss"] for h in hist if "eval_loss" in h},
        "device": str(trainer.args.device), "optim": str(trainer.args.optim), "world": trainer.args.world_size,
        "compiles": Steps.compiles, "step_ends": Steps.ends}))
