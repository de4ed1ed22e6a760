"""Defaults in code, overridden by a ``local.json`` when there is one (tried with ``open``, as people write it),
and a tokenizer-like package installed in the project's own ``.venv`` that reads its data file as it loads."""

import argparse
import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(
    0, ".venv/lib/python3.11/site-packages"
)  # the project's environment, as its interpreter has it
import vocabpkg  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=32)
args = parser.parse_args()

config = {"width": 64, "lr": 1e-3}
try:
    with open("local.json") as handle:
        config.update(json.load(handle))
except FileNotFoundError:
    pass

width = config["width"]
data = TensorDataset(torch.randn(4096, 64), torch.randn(4096, 1))
model = nn.Sequential(
    nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, len(vocabpkg.WORDS))
)
optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
for epoch in range(100):
    for x, y in DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True):
        loss = nn.functional.mse_loss(model(x).mean(1, keepdim=True), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
