"""A plain loop that accumulates gradients itself: four micro-batches (backward passes) per optimizer step."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--accumulate", type=int, default=4)
args = parser.parse_args()

model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1000):
    for _ in range(args.accumulate):
        loss = model(torch.randn(args.batch_size, 256)).pow(2).mean() / args.accumulate
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
