"""Plain SGD written by hand (no torch.optim): ``p.data -= lr * p.grad`` after each backward pass."""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description="a regression trained with a hand-written update")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--epochs", type=int, default=1000)
parser.add_argument("--lr", type=float, default=0.01)
args = parser.parse_args()

torch.manual_seed(0)
inputs = torch.randn(2048, 128)
targets = inputs.sum(dim=1, keepdim=True)
loader = DataLoader(TensorDataset(inputs, targets), batch_size=args.batch_size, shuffle=True)
model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 1))

for epoch in range(args.epochs):
    for x, y in loader:
        loss = F.mse_loss(model(x), y)
        model.zero_grad()
        loss.backward()
        for p in model.parameters():
            p.data -= args.lr * p.grad
    print(f"epoch {epoch} loss {loss.item():.4f}")
