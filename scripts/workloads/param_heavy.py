"""Benchmark workload: a parameter-heavy model (most of the peak is parameters and optimizer state).

A 49152 x 512 embedding table (25.2 M parameters, P = 96 MiB in fp32) looked up for 128 tokens per
sample, a per-token 512 -> 64 GELU layer, mean pooling and a 16-class head. With AdamW the static
memory (parameters, gradients, two states: 4P = 384 MiB) dwarfs a sample's activations (about 0.6 MiB),
and the first ``optimizer.step()`` allocates the states lazily, so a one-step probe misses them. Little
arithmetic per sample: a step at the maximum takes about a second on 2 shared cores.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, HIDDEN, TOKENS, CLASSES = 49152, 512, 64, 128, 16


class ParamHeavy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(VOCAB, DIM)
        self.mix = nn.Linear(DIM, HIDDEN)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.head(F.gelu(self.mix(self.table(token_ids))).mean(dim=1))


def build_model() -> nn.Module:
    return ParamHeavy()


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    token_ids = torch.randint(0, VOCAB, (batch_size, TOKENS), generator=generator)
    return token_ids, torch.randint(0, CLASSES, (batch_size,), generator=generator)


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    token_ids, labels = batch
    return F.cross_entropy(model(token_ids), labels)
