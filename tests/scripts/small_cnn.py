"""Fixture: a small image classifier with no repeated blocks (one convolution, one head).

Nothing in it repeats, so recomputation has nothing to wrap.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

CLASSES, SIDE = 10, 32


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(8),
        nn.Flatten(),
        nn.Linear(16 * 8 * 8, CLASSES),
    )


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.randn(batch_size, 3, SIDE, SIDE)
    return images, torch.randint(0, CLASSES, (batch_size,))


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)
