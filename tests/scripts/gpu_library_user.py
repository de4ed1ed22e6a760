"""Fixture: a model built with a GPU library (``gpukernels``, in tests/libs, which ``PYTHONPATH`` names)
that asks ``torch.cuda.is_available()`` as it loads, imported at the script's top as people import such
libraries."""

from __future__ import annotations

import gpukernels
import torch
import torch.nn.functional as F
from torch import nn


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(32, gpukernels.width()), nn.ReLU(), nn.Linear(gpukernels.width(), 10))


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 32), torch.randint(0, 10, (batch_size,))


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)
