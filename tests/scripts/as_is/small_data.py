"""A plain loop over a small tabular dataset (600 rows, made at import), as people write one: a DataLoader of
``--batch-size``, a few epochs. A batch above 600 is one batch of 600 an epoch."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

features = torch.randn(600, 32)
labels = (features.sum(1, keepdim=True) > 0).float()
loader = DataLoader(TensorDataset(features, labels), batch_size=args.batch_size, shuffle=True)
model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for epoch in range(args.epochs):
    for x, y in loader:
        loss = nn.functional.binary_cross_entropy_with_logits(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
