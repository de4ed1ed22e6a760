"""Fixture for the bad-input catalogue (tests/reliability/catalogue.py): reads its arguments from sys.argv at import (given after --)."""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

WIDTH = int(sys.argv[sys.argv.index("--width") + 1]) if "--width" in sys.argv else 8


def build_model() -> nn.Module:
    return nn.Linear(WIDTH, 2)


def make_batch(batch_size: int):
    return torch.randn(batch_size, WIDTH), torch.randint(0, 2, (batch_size,))


def compute_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)
