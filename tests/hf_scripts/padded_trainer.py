"""A HuggingFace Trainer fine-tune of a tiny BERT classifier built from a config (no download) on
sentences of varying length, batched by ``DataCollatorWithPadding`` (pad to the longest of each
batch): nothing XLA-specific, every batch a new length. Run as ``python padded_trainer.py OUT``
(eager) or ``lazyxla run padded_trainer.py OUT``. Environment: SENTENCES (96), BATCH (4), MIN_LEN
(8), MAX_LEN (64). Prints ``RESULT`` and JSON: the losses by step, the distinct lengths, and
(through torch_xla's metrics, when a torch_xla is there) the programs compiled."""
import json
import os
import sys
import time

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from torch.utils.data import Dataset
from transformers import (BertConfig, BertForSequenceClassification, DataCollatorWithPadding,
                          PreTrainedTokenizerFast, Trainer, TrainingArguments, set_seed)

out = sys.argv[1]
n = int(os.environ.get("SENTENCES", "96"))
batch = int(os.environ.get("BATCH", "4"))
lo, hi = int(os.environ.get("MIN_LEN", "8")), int(os.environ.get("MAX_LEN", "64"))

words = [f"w{i}" for i in range(90)]
vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{w: i + 4 for i, w in enumerate(words)}}
tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                    cls_token="[CLS]", sep_token="[SEP]")


class Sentences(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(lo, hi + 1, (1,), generator=g))
            ids = torch.randint(4, len(vocab), (length,), generator=g).tolist()
            self.items.append({"input_ids": ids, "attention_mask": [1] * length,
                               "labels": int(sum(ids) % 2)})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


lengths = set()


class Collator(DataCollatorWithPadding):
    def __call__(self, features):
        b = super().__call__(features)
        lengths.add(int(b["input_ids"].shape[1]))
        return b


set_seed(0)
cfg = BertConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=128, max_position_embeddings=128, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0, num_labels=2)
model = BertForSequenceClassification(cfg)
args = TrainingArguments(output_dir=out, num_train_epochs=1, per_device_train_batch_size=batch, logging_steps=1,
                         report_to=[], seed=0, learning_rate=1e-3, save_strategy="no", eval_strategy="no",
                         dataloader_drop_last=False)
trainer = Trainer(model=model, args=args, train_dataset=Sentences(), data_collator=Collator(tokenizer))
t0 = time.perf_counter()
trainer.train()
wall = time.perf_counter() - t0
compiles = None
try:
    import torch_xla.debug.metrics as met
    compiles = met.counter_value("UncachedCompile")
except ImportError:
    pass
print("RESULT " + json.dumps({"losses": {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h},
                              "lengths": sorted(lengths), "compiles": compiles, "train_seconds": wall,
                              "device": str(trainer.args.device)}))
