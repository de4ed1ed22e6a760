"""A small model whose rank 0 keeps 8 MiB more after each of its first four steps (a metrics buffer only the
first rank fills, as logging on rank 0 does): rank 1's peak holds still from its second step, rank 0's from
its sixth. A rank that stopped at its own steady peak would leave the other in the next step's collective."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

KEPT: list[torch.Tensor] = []


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))


def make_batch(batch_size: int) -> torch.Tensor:
    return torch.randn(batch_size, 64)


def compute_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized() and dist.get_rank() == 0 and len(KEPT) < 4:
        KEPT.append(torch.ones(8 << 20, dtype=torch.uint8))
    return model(batch).square().mean()
