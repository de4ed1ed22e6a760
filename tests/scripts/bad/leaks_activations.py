"""Fixture for the unsteady-peak checks (tests/reliability/test_unsteady_peaks.py): compute_loss keeps every
step's activations in a global list (for a later look, it says), so the step's peak grows at every step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FEATURES, WIDTH, CLASSES = 64, 256, 10
FEATURES_SEEN: list[torch.Tensor] = []  # every step's hidden features, kept to plot them later


def build_model() -> nn.Module:
    return nn.ModuleDict(
        {
            "body": nn.Sequential(nn.Linear(FEATURES, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU()),
            "head": nn.Linear(WIDTH, CLASSES),
        }
    )


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, FEATURES), torch.randint(0, CLASSES, (batch_size,))


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, labels = batch
    hidden = model["body"](inputs)
    FEATURES_SEEN.append(hidden.detach())
    return F.cross_entropy(model["head"](hidden), labels)
