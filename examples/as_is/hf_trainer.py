"""A Hugging Face ``Trainer`` script as people write it: a model from its config, a data set, ``train()``.

It defines none of autobatch's three functions: autobatch runs it as it is, as ``__main__``, with the batch
size in its arguments, and ends it after the optimizer steps each probe needs (the ``Trainer``'s optimizer is
a ``torch.optim.AdamW``, whose steps autobatch sees whatever wraps it)::

    autobatch tune examples/as_is/hf_trainer.py --device cpu --memory 1GiB -- --batch-size {batch}

``{batch}`` becomes ``per_device_train_batch_size``. The model is a small GPT-2 built from its config class
(no download: two layers of 64 features, 4096 tokens of vocabulary, 64 positions), trained as a causal
language model on random token ids (no tokenizer): the logits and the loss over 4096 tokens dominate, about
4.5 MiB per sample, so the maximum under 1 GiB is about a hundred samples. The data set lives in the probe's
memory as it does in the job's, so it is kept small here (1 MiB). Run directly
(``python examples/as_is/hf_trainer.py``), it trains.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

parser = argparse.ArgumentParser(description="a small GPT-2 trained with transformers.Trainer")
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--samples", type=int, default=2048)
parser.add_argument("--seq-len", type=int, default=64)
parser.add_argument("--lr", type=float, default=3e-4)
args = parser.parse_args()


class RandomTokens(Dataset):
    """Random token ids standing in for a tokenized corpus (the labels are the ids: a causal LM)."""

    def __init__(self, samples: int, seq_len: int, vocab: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (samples, seq_len), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


config = GPT2Config(vocab_size=4096, n_positions=args.seq_len, n_embd=64, n_layer=2, n_head=4)
model = GPT2LMHeadModel(config)
train_data = RandomTokens(args.samples, args.seq_len, config.vocab_size)

training_args = TrainingArguments(
    output_dir=os.path.join(tempfile.gettempdir(), "hf_trainer_example"),
    per_device_train_batch_size=args.batch_size,
    num_train_epochs=args.epochs,
    learning_rate=args.lr,
    logging_steps=50,
    save_strategy="no",
    report_to="none",
    use_cpu=True,
    dataloader_num_workers=0,
)
trainer = Trainer(model=model, args=training_args, train_dataset=train_data)
trainer.train()
