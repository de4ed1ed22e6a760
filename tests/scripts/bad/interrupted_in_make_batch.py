"""Fixture for the bad-input catalogue (tests/reliability/catalogue.py): make_batch raises KeyboardInterrupt,
as a script does that stops training from a file (`touch STOP`) the way Ctrl-C would; the exception carries
no message."""

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

STOP = Path("STOP")


def build_model():
    return nn.Linear(8, 2)


def make_batch(batch_size):
    if STOP.exists():
        raise KeyboardInterrupt
    return torch.randn(batch_size, 8), torch.randint(0, 2, (batch_size,))


def compute_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)
