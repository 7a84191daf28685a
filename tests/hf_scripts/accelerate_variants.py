"""A plain accelerate loop written the ways users write it (issue 31): the optimizer made before or
after ``Accelerator()``, ``prepare`` in one call or one per object (the optimizer first or last), batches
as a plain token tensor or as dicts, AdamW or SGD. Every form must train: the optimizer follows the
parameters ``prepare`` (or the user's ``model.to``) replaced. ``VARIANTS`` (comma-separated) picks the
forms (see FORMS), run one after another in this process, accelerate's state reset before each (as a
new process has it), so they share the device's compiled programs.
Run as ``python accelerate_variants.py OUT`` or under ``lazyxla run``; prints ``RESULT`` and JSON: per
form, the losses, where the optimizer's parameters live and how many have state."""
import json
import os

import torch
from torch.utils.data import DataLoader
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from transformers import GPT2Config, GPT2LMHeadModel

FORMS = {
    # name: (Accelerator made first, how prepare is called, batches as dicts, optimizer)
    "issue": (False, "together", False, "adamw"),         # the loop of issue 31 as filed
    "accelerator_first": (True, "together", True, "adamw"),
    "separate_calls": (False, "separate", False, "adamw"),
    "optimizer_first": (True, "optimizer_first", True, "adamw"),
    "user_moves_model": (True, "user_to", False, "adamw"),  # model.to(acc.device) after making the optimizer
    "sgd": (False, "together", False, "sgd"),
}


def run(form):
    acc_first, how, as_dicts, kind = FORMS[form]
    AcceleratorState._reset_state(True)  # as a new process: no accelerate state yet
    GradientState._reset_state()
    torch.manual_seed(0)
    acc = Accelerator() if acc_first else None
    cfg = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg)
    tokens = torch.randint(0, 128, (24, 16), generator=torch.Generator().manual_seed(1))
    loader = DataLoader([{"input_ids": t} for t in tokens] if as_dicts else tokens, batch_size=4)
    opt = (torch.optim.AdamW(model.parameters(), lr=1e-2) if kind == "adamw"
           else torch.optim.SGD(model.parameters(), lr=0.5))
    acc = acc or Accelerator()
    if how == "together":
        model, opt, loader = acc.prepare(model, opt, loader)
    elif how == "separate":
        model = acc.prepare(model)
        opt = acc.prepare(opt)
        loader = acc.prepare(loader)
    elif how == "optimizer_first":
        opt, model, loader = acc.prepare(opt, model, loader)
    else:
        model.to(acc.device)
        opt, loader = acc.prepare(opt, loader)
    losses = []
    for b in loader:
        x = b["input_ids"] if as_dicts else b
        loss = model(input_ids=x, labels=x).loss
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(acc.gather(loss.detach()).mean().item())
    inner = opt.optimizer
    return {"losses": losses, "param_device": str(inner.param_groups[0]["params"][0].device),
            "model_device": str(next(model.parameters()).device), "with_state": len(inner.state),
            "same_objects": all(a is b for a, b in zip(inner.param_groups[0]["params"], model.parameters()))}


print("RESULT " + json.dumps({f: run(f) for f in os.environ.get("VARIANTS", "issue").split(",")}))
