"""Fixture: ``compute_loss`` returns one loss per sample (shape ``(batch_size,)``), not a scalar.

autobatch must report that ``compute_loss`` has to return a scalar, naming the shape it got, rather than
let ``backward()`` fail with PyTorch's "grad can be implicitly created only for scalar outputs".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def build_model() -> nn.Module:
    return nn.Linear(8, 3)


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(batch_size, 8, generator=generator)
    labels = torch.randint(0, 3, (batch_size,), generator=generator)
    return features, labels


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    features, labels = batch
    return F.cross_entropy(model(features), labels, reduction="none")  # the bug: no reduction
