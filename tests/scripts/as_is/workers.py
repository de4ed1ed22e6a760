"""A plain loop whose DataLoader starts two worker processes, and a script that mentions its own finder
(find_executable_batch_size, which it never calls)."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, required=True)
args = parser.parse_args()
data = TensorDataset(torch.randn(4096, 64), torch.randn(4096, 1))
loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=2)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
optimizer = torch.optim.AdamW(model.parameters())
for epoch in range(100):
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
