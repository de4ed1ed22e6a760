"""Fixture: a valid tiny script whose process dies by SIGABRT (``os.abort()``) at batch sizes >= 8.

It stands for a native crash (a segfault in an extension, an illegal memory access): autobatch must
report the probe as a crash, never as an out-of-memory boundary, and keep running its own process.
Batches below CRASH_AT train normally.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

CRASH_AT = 8


def build_model() -> nn.Module:
    return nn.Linear(8, 2)


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(batch_size, 8, generator=generator)
    labels = torch.randint(0, 2, (batch_size,), generator=generator)
    return features, labels


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    features, labels = batch
    if features.shape[0] >= CRASH_AT:
        os.abort()
    return F.cross_entropy(model(features), labels)
