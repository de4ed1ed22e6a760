"""A script that moves into its outputs folder (as Hydra runs do) and writes its metrics and checkpoint there,
relative to it, overwriting what an earlier run left."""

import argparse
import os

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--steps", type=int, default=1000)
args = parser.parse_args()

os.makedirs("outputs", exist_ok=True)
os.chdir("outputs")
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(args.steps):
    inputs = torch.randn(args.batch_size, 64)
    loss = model(inputs).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with open("metrics.csv", "a") as metrics:
        metrics.write(f"{step},{loss.item():.6f}\n")
    torch.save(model.state_dict(), "last.pt")
