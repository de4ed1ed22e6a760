"""Fixture for the bad-input catalogue (tests/reliability/catalogue.py): make_batch ignores its batch_size (always 7 rows)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def build_model() -> nn.Module:
    return nn.Linear(8, 2)


def make_batch(batch_size: int):
    return torch.randn(7, 8), torch.randint(0, 2, (7,))


def compute_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)
