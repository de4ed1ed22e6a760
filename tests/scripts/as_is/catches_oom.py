"""Catches the out-of-memory error itself and goes on with half the batch, as retry loops do."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, required=True)
args = parser.parse_args()
model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
batch = args.batch_size
for _ in range(100):
    try:
        loss = model(torch.randn(batch, 1024)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    except RuntimeError as exc:
        if "can't allocate memory" not in str(exc):
            raise
        batch = max(1, batch // 2)
        print(f"out of memory: retrying with {batch}")
