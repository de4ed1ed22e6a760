"""Fixture for the bad-input catalogue (tests/reliability/catalogue.py): allocates host memory without bound above batch 16 (the cap makes it an out-of-memory)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def build_model() -> nn.Module:
    return nn.Linear(8, 2)


def make_batch(batch_size: int):
    if batch_size > 16:
        hog = [torch.ones(1 << 26) for _ in range(10_000)]  # 256 MiB at a time, until the cap
        del hog
    return torch.randn(batch_size, 8), torch.randint(0, 2, (batch_size,))


def compute_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)
