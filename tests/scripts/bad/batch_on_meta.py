"""Fixture for the bad-input catalogue (tests/reliability/catalogue.py): make_batch returns tensors on the
meta device (shapes only, "to save memory"), which carry no data."""

import torch
import torch.nn.functional as F
from torch import nn


def build_model():
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))


def make_batch(batch_size):
    # only the shapes matter for memory
    x = torch.empty(batch_size, 32, device="meta")
    y = torch.empty(batch_size, dtype=torch.long, device="meta")
    return x, y


def compute_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)
