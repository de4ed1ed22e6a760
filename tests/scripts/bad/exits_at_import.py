"""Fixture for the bad-input catalogue (tests/reliability/catalogue.py): argument parsing at import exits (a required flag)."""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--size", required=True)
ARGS = parser.parse_args()


def build_model() -> nn.Module:
    return nn.Linear(8, 2)


def make_batch(batch_size: int):
    g = torch.Generator().manual_seed(0)
    return torch.randn(batch_size, 8, generator=g), torch.randint(0, 2, (batch_size,), generator=g)


def compute_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)
