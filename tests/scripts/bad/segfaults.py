"""Fixture for the bad-input catalogue (tests/reliability/catalogue.py): segfaults (a native crash) at batch sizes above 16."""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch import nn


def build_model() -> nn.Module:
    return nn.Linear(8, 2)


def make_batch(batch_size: int):
    if batch_size > 16:
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    return torch.randn(batch_size, 8), torch.randint(0, 2, (batch_size,))


def compute_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)
