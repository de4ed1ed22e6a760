"""Fixture: a valid tiny script whose ``make_batch`` refuses batches larger than its data set.

autobatch must report this as the script's error, with its message, and never as an out-of-memory
boundary (a batch of 65 fails here for a reason no memory budget can fix).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DATASET_SIZE = 64


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    if batch_size > DATASET_SIZE:
        raise ValueError(f"batch_size {batch_size} exceeds the dataset's {DATASET_SIZE} samples")
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(batch_size, 16, generator=generator)
    labels = torch.randint(0, 4, (batch_size,), generator=generator)
    return features, labels


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    features, labels = batch
    return F.cross_entropy(model(features), labels)
