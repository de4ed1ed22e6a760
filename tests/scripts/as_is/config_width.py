"""Reads its model's width from a JSON config passed as an argument, as most training scripts are configured."""

import argparse
import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--config", required=True)
parser.add_argument("--batch-size", type=int, default=32)
args = parser.parse_args()

with open(args.config) as handle:
    config = json.load(handle)

width = config["width"]
data = TensorDataset(torch.randn(4096, 64), torch.randn(4096, 1))
model = nn.Sequential(
    nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1)
)
optimizer = torch.optim.AdamW(model.parameters(), lr=config.get("lr", 1e-3))
for epoch in range(100):
    for x, y in DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
