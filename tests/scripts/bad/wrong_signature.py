"""Fixture for the bad-input catalogue (tests/reliability/catalogue.py): make_batch takes no argument."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def build_model() -> nn.Module:
    return nn.Linear(8, 2)


def make_batch():
    return torch.randn(4, 8)


def compute_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)
