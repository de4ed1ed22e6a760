"""Fixture for the bad-input catalogue (tests/reliability/catalogue.py): no make_batch."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn


def build_model() -> nn.Module:
    return nn.Linear(8, 2)


def compute_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)
