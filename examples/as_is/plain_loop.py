"""A training script as people write it: argparse, a DataLoader over data prepared at start, a plain loop.

It defines none of autobatch's three functions: autobatch runs it as it is, as ``__main__``, with the batch
size in its arguments, and ends it after the optimizer steps each probe needs::

    autobatch tune examples/as_is/plain_loop.py --device cpu --memory 1GiB -- --batch-size {batch}

``{batch}`` is replaced by each probe's micro-batch; ``--variant bf16=--bf16`` searches the script with its
``--bf16`` flag too (the forward autocast to bfloat16; on the CPU its peak moves from step to step, and the
result says so), ``--variant deep=--layers 8`` with twice the blocks, and the table compares them. The model reads 256 tokens per sample and runs four
Linear + ReLU blocks of 256 features on each (about 3.6 MiB of activations per sample), so the maximum under
1 GiB is a few hundred samples. The data set lives in the probe's memory as it does in the job's, so it is
kept small here (1 MiB). Run directly (``python examples/as_is/plain_loop.py``), it trains.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description="a plain training loop")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--epochs", type=int, default=20)
parser.add_argument("--samples", type=int, default=1024)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--layers", type=int, default=4, help="Linear + ReLU blocks")
parser.add_argument("--bf16", action="store_true", help="autocast the forward to bfloat16")
args = parser.parse_args()

torch.manual_seed(0)
TOKENS, VOCAB, WIDTH, CLASSES = 256, 1000, 256, 10
tokens = torch.randint(0, VOCAB, (args.samples, TOKENS), dtype=torch.int32)  # 1 MiB
labels = torch.randint(0, CLASSES, (args.samples,))
loader = DataLoader(TensorDataset(tokens, labels), batch_size=args.batch_size, shuffle=True)


class MeanPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)


model = nn.Sequential(
    nn.Embedding(VOCAB, WIDTH),
    *[layer for _ in range(args.layers) for layer in (nn.Linear(WIDTH, WIDTH), nn.ReLU())],
    MeanPool(),
    nn.Linear(WIDTH, CLASSES),
)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

for epoch in range(args.epochs):
    for step, (x, y) in enumerate(loader):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 20 == 0:
            print(f"epoch {epoch} step {step} loss {loss.item():.3f}")
