"""Fixture for the bad-input catalogue (tests/reliability/catalogue.py): its probe process is SIGKILLed once, at the first probe above batch 16 (a marker file
named by KILLED_ONCE_MARKER remembers it); the retry in a fresh process fits."""

from __future__ import annotations

import os
import signal

import torch
import torch.nn.functional as F
from torch import nn


def build_model() -> nn.Module:
    return nn.Linear(8, 2)


def make_batch(batch_size: int):
    marker = os.environ.get("KILLED_ONCE_MARKER", "")
    if batch_size > 16 and marker and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return torch.randn(batch_size, 8), torch.randint(0, 2, (batch_size,))


def compute_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)
