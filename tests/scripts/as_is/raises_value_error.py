"""A training script run as it is that trains one step, then raises its own ValueError (a bad label in its data):
the job's error, not memory, so ``autobatch run`` passes its exit code through and never relaunches it."""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, required=True)
parser.add_argument("--grad-accum", type=int, default=1)
args = parser.parse_args()

model = nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
labels = [0, 1, 7]  # 7 is not a class
for step, label in enumerate(labels):
    if label > 1:
        raise ValueError(f"label {label} at step {step} is not a class of this model")
    loss = F.cross_entropy(model(torch.randn(args.batch_size, 8)), torch.full((args.batch_size,), label))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
