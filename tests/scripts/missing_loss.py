"""Fixture: breaks the contract by defining ``build_model`` and ``make_batch`` but no ``compute_loss``.

autobatch must stop before probing with an error that names ``compute_loss`` and shows its signature.
"""

from __future__ import annotations

import torch
from torch import nn


def build_model() -> nn.Module:
    return nn.Linear(8, 2)


def make_batch(batch_size: int) -> torch.Tensor:
    return torch.randn(batch_size, 8)


def loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Not the contract's name: autobatch looks up ``compute_loss`` only."""
    return model(batch).square().mean()
