"""A script run from its run folder: it reads data/train.csv there and writes its checkpoint, its CSV log and
a runs/ folder of its own next to it, overwriting what an earlier run left."""

import argparse
import csv
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=100)
args = parser.parse_args()

with open("data/train.csv", newline="") as handle:
    rows = [[float(v) for v in row] for row in csv.reader(handle)]
features = torch.tensor(rows)
data = TensorDataset(features[:, :-1].repeat(64, 1), features[:, -1:].repeat(64, 1))

run_dir = os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
os.makedirs(run_dir, exist_ok=True)
model = nn.Sequential(nn.Linear(features.shape[1] - 1, 256), nn.ReLU(), nn.Linear(256, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

step = 0
for epoch in range(args.epochs):
    for x, y in DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        with open("train_log.csv", "a") as log:
            log.write(f"{epoch},{step},{loss.item():.6f}\n")
        with open(os.path.join(run_dir, "events.txt"), "a") as events:
            events.write(f"step {step}\n")
        torch.save({"model": model.state_dict(), "step": step}, "ckpt_last.pt")
