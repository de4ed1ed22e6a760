"""Fixture: a contrastive loss whose memory is quadratic in the batch size.

A small encoder maps each sample to an embedding; the loss compares every sample with every other one
through a batch x batch similarity matrix (InfoNCE, as in SimCLR or CLIP, here with each sample's
positive being itself under a second noisy view). The B x B matrix, its scaled copy, its log-softmax and
their gradients dominate the peak at large batches, so peak(b) ~ a + k*b + q*b^2: an affine model of
memory against batch size mispredicts the boundary, and the search must still land on the exact maximum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FEATURES = 64
EMBEDDING = 32
TEMPERATURE = 0.1


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, EMBEDDING))


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    view_a = torch.randn(batch_size, FEATURES, generator=generator)
    view_b = view_a + 0.1 * torch.randn(batch_size, FEATURES, generator=generator)
    return view_a, view_b


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    view_a, view_b = batch
    z_a = F.normalize(model(view_a), dim=1)
    z_b = F.normalize(model(view_b), dim=1)
    similarity = z_a @ z_b.T / TEMPERATURE  # (batch, batch)
    targets = torch.arange(similarity.shape[0], device=similarity.device)
    return F.cross_entropy(similarity, targets)
