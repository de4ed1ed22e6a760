"""A loop that accumulates gradients over 100 micro-batches before each optimizer step (a large global batch
on a small machine)."""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description="a classifier with gradient accumulation")
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--accumulate", type=int, default=100, help="micro-batches per optimizer step")
parser.add_argument("--epochs", type=int, default=100)
args = parser.parse_args()

torch.manual_seed(0)
features = torch.randn(4096, 256)
labels = torch.randint(0, 10, (4096,))
loader = DataLoader(TensorDataset(features, labels), batch_size=args.batch_size, shuffle=True)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

micro = 0
for epoch in range(args.epochs):
    for x, y in loader:
        loss = F.cross_entropy(model(x), y) / args.accumulate
        loss.backward()
        micro += 1
        if micro % args.accumulate == 0:
            optimizer.step()
            optimizer.zero_grad()
