"""Benchmark workload: a peak that is flat over most batch sizes, then rises.

A 65536 x 384 embedding table (25.2 M parameters, P = 96 MiB in fp32) looked up for 512 tokens per
sample, mean-pooled, and a 16-class head. The optimizer step's peak (parameters, gradients, the two
AdamW states and the step's temporaries) does not depend on the batch and sets the step's peak until
the forward and backward pass (4P + about 0.75 MiB per sample) overtakes it: under the benchmark's cap
that happens at most 30 % below the maximum, so a line through two small batches' total peaks is flat
and says nothing about where the boundary is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, TOKENS, CLASSES = 65536, 384, 512, 16


class FlatThenRising(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(VOCAB, DIM)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.table(token_ids).mean(dim=1))


def build_model() -> nn.Module:
    return FlatThenRising()


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    token_ids = torch.randint(0, VOCAB, (batch_size, TOKENS), generator=generator)
    return token_ids, torch.randint(0, CLASSES, (batch_size,), generator=generator)


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    token_ids, labels = batch
    return F.cross_entropy(model(token_ids), labels)
