"""An accelerate script as people write it: ``Accelerator``, ``prepare``, ``accelerator.backward``, a loop.

It defines none of autobatch's three functions: autobatch runs it as it is, as ``__main__``, with the batch
size in its arguments, and ends it after the optimizer steps each probe needs (``prepare`` wraps the
``torch.optim.AdamW``; autobatch sees the steps of the optimizer inside)::

    autobatch tune examples/as_is/accelerate_loop.py --device cpu --memory 1GiB -- --batch-size {batch}

``{batch}`` is the ``DataLoader``'s batch size (per process). The model is a small Transformer encoder
(two layers of 64 features, four heads, 256 tokens per sample) over a token embedding, mean-pooled into a
classifier: about 9 MiB of activations per sample, most of them the attention's 256 x 256 weights per head,
so the maximum under 1 GiB is some tens of samples. The data set lives in the probe's memory as it does in
the job's, so it is kept small here (8 MiB). Run directly (``python examples/as_is/accelerate_loop.py``, or
with ``accelerate launch``), it trains.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description="a training loop with accelerate")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--samples", type=int, default=4096)
parser.add_argument("--lr", type=float, default=3e-4)
args = parser.parse_args()

TOKENS, VOCAB, WIDTH, CLASSES = 256, 2000, 64, 10


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, nhead=4, dim_feedforward=4 * WIDTH, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


accelerator = Accelerator(cpu=True)
set_seed(0)
tokens = torch.randint(0, VOCAB, (args.samples, TOKENS))  # 8 MiB
labels = torch.randint(0, CLASSES, (args.samples,))
loader = DataLoader(TensorDataset(tokens, labels), batch_size=args.batch_size, shuffle=True)
model = Encoder()
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

model.train()
for epoch in range(args.epochs):
    for step, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step % 20 == 0:
            accelerator.print(f"epoch {epoch} step {step} loss {loss.item():.3f}")
