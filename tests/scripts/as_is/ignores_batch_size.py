"""Reads --batch-size but the loader is built from a config value: the flag never reaches the step."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

CONFIG = {"batch_size": 32, "lr": 0.01}

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=CONFIG["batch_size"])
args = parser.parse_args()

data = TensorDataset(torch.randn(4096, 256), torch.randn(4096, 1))
loader = DataLoader(data, batch_size=CONFIG["batch_size"], shuffle=True)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=CONFIG["lr"])
for epoch in range(100):
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
