"""Fixture: a model whose width comes from an installed library (``warmlib``, in a folder that ``PYTHONPATH``
names), imported at the script's top as people import ``transformers``; its ``width()`` imports more of it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import warmlib
from torch import nn


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(32, warmlib.width()), nn.ReLU(), nn.Linear(warmlib.width(), 10))


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 32), torch.randint(0, 10, (batch_size,))


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)
