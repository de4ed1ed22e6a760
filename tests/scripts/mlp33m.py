"""Fixture: a 33 M-parameter MLP in an ``nn.Sequential``, trained on random 1536-feature samples.

The shape of the issue's model: eight 2048-wide Linear + ReLU layers and a 10-class head. Under a 1 GiB
cap with AdamW in fp32, parameters, gradients and the two moment buffers take about 520 MB, so the
activations get what is left and the maximum batch is in the low thousands. Each step draws a new batch,
as a job's data loader does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FEATURES, HIDDEN, DEPTH, CLASSES = 1536, 2048, 8, 10


def build_model() -> nn.Module:
    layers: list[nn.Module] = []
    for index in range(DEPTH):
        layers += [nn.Linear(FEATURES if index == 0 else HIDDEN, HIDDEN), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(HIDDEN, CLASSES))


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, FEATURES), torch.randint(0, CLASSES, (batch_size,))


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels)
