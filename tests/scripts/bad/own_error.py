"""Fixture for the bad-input catalogue (tests/reliability/catalogue.py): compute_loss raises the script's own error."""

from __future__ import annotations

import torch
from torch import nn


def build_model() -> nn.Module:
    return nn.Linear(8, 2)


def make_batch(batch_size: int):
    g = torch.Generator().manual_seed(0)
    return torch.randn(batch_size, 8, generator=g), torch.randint(0, 2, (batch_size,), generator=g)


def compute_loss(model, batch):
    raise ValueError("labels out of range (the script's own bug)")
