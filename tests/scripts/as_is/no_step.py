"""Trains with an update of its own (no torch.optim optimizer): autobatch never sees a step."""

import os

import torch
from torch import nn

batch = int(os.environ["BATCH"])
model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
while True:
    loss = model(torch.randn(batch, 64)).pow(2).mean()
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad
