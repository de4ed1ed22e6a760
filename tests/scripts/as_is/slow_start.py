"""Prepares its data for longer than a probe waits (a minute of "tokenizing") before it trains."""

import os
import time

import torch
from torch import nn

batch = int(os.environ["BATCH"])
print("tokenizing the corpus ...", flush=True)
time.sleep(60)
model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
while True:
    loss = model(torch.randn(batch, 64)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
