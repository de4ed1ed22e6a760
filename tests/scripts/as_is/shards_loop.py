"""A training loop over data shards named on its command line, as a job passes a glob of thousands of files::

    python shards_loop.py --batch-size 64 --shards data/shard-*.txt

Each shard is one sample: a line of 64 token ids. The script opens every shard it is given, builds a data set and
trains a small classifier for ``--epochs`` epochs.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description="a training loop over shard files")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--shards", nargs="+", required=True, help="the data's shard files, one sample each")
parser.add_argument("--epochs", type=int, default=20)
args = parser.parse_args()

rows = []
for path in args.shards:
    with open(path) as shard:
        rows.append([int(token) for token in shard.read().split()])
tokens = torch.tensor(rows)
labels = tokens[:, 0] % 10
loader = DataLoader(TensorDataset(tokens, labels), batch_size=args.batch_size, shuffle=True)


class MeanPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)


model = nn.Sequential(nn.Embedding(1000, 256), nn.Linear(256, 256), nn.ReLU(), MeanPool(), nn.Linear(256, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(args.epochs):
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.3f}")
