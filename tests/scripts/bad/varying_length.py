"""Fixture for the unsteady-peak checks (tests/reliability/test_unsteady_peaks.py): a speech-style encoder whose
make_batch draws a sequence length per call, as audio and text loaders do, so the step's peak depends on the data.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FEATURES, WIDTH, CLASSES = 80, 256, 32
MIN_FRAMES, MAX_FRAMES = 50, 400


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(FEATURES, WIDTH)
        self.body = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH), nn.GELU())
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.proj(frames)))


def build_model() -> nn.Module:
    return Encoder()


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    frames = int(torch.randint(MIN_FRAMES, MAX_FRAMES + 1, ()))  # this batch's utterance length
    return torch.randn(batch_size, frames, FEATURES), torch.randint(0, CLASSES, (batch_size, frames))


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    features, labels = batch
    return F.cross_entropy(model(features).flatten(0, 1), labels.flatten())
