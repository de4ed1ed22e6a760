"""Fixture: ``build_model`` sleeps (SLEEPY_SECONDS, default 600 s), so a probe of it hits its timeout.

Otherwise a valid tiny script: with SLEEPY_SECONDS=0 it tunes like any other.
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F
from torch import nn


def build_model() -> nn.Module:
    time.sleep(float(os.environ.get("SLEEPY_SECONDS", "600")))
    return nn.Linear(8, 2)


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(batch_size, 8, generator=generator)
    labels = torch.randint(0, 2, (batch_size,), generator=generator)
    return features, labels


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    features, labels = batch
    return F.cross_entropy(model(features), labels)
