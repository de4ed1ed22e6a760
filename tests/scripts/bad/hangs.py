"""Fixture for the bad-input catalogue (tests/reliability/catalogue.py): hangs at batch sizes above 16 (until its probe times out)."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn


def build_model() -> nn.Module:
    return nn.Linear(8, 2)


def make_batch(batch_size: int):
    if batch_size > 16:
        time.sleep(3600)
    return torch.randn(batch_size, 8), torch.randint(0, 2, (batch_size,))


def compute_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)
