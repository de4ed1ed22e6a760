"""Fixture: a model whose second step needs far more memory than its first (the later-step trap).

Parameter-heavy, with modest activations and almost no arithmetic: an embedding table of
VOCAB x DIM = 32768 x 512 = 16.8 M parameters (P = 64 MiB in fp32) looked up for TOKENS = 256 tokens
per sample, mean-pooled, and a small linear classifier. Its dense gradient is another P. AdamW keeps two
parameter-sized states, which ``torch.optim`` allocates lazily, inside the FIRST ``optimizer.step()``.

Peak data memory beyond the process's baseline (about 300 MiB here: torch's import, thread stacks and
allocator slack), with
A(b) = b * TOKENS * DIM * 4 B = b * 0.5 MiB (the embedding output, and its gradient during backward):

* step 1, forward + backward: parameters + gradients + A(b)          = 2P + A(b) = 128 MiB + A(b)
* step 1, optimizer.step():   + 2 states + AdamW's temporaries        ~ 6P        = 384 MiB
* step 2+, forward + backward: parameters + 2 states + gradients + A(b) = 4P + A(b) = 256 MiB + A(b)

So under a cap C, a probe that stops after one step accepts every b with 2P + A(b) <= C - baseline, and
the same batch runs out of memory in step 2 once A(b) > C - baseline - 4P: the trap spans 2P / 0.5 MiB,
about 256 samples, whatever the cap. Measured here (fresh process per probe, MALLOC_ARENA_MAX=1,
MALLOC_MMAP_THRESHOLD_=65536, RLIMIT_DATA on the whole process, torch 2.13 CPU), the largest batch that
completes 1 AdamW step / 5 AdamW steps: 1179 / 926 under 1 GiB, 3220 / 2966 under 2 GiB (253 and 254
samples apart; 0.50 MiB per sample between the caps).

No matmul scales with P or with the batch: a step costs memory traffic (about 1 s at the 1 GiB maximum on
2 shared cores), so a test can afford a few probes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 32768
DIM = 512
TOKENS = 256
CLASSES = 16


class TrapModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(VOCAB, DIM)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.table(token_ids).mean(dim=1))


def build_model() -> nn.Module:
    return TrapModel()


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    token_ids = torch.randint(0, VOCAB, (batch_size, TOKENS), generator=generator)
    labels = torch.randint(0, CLASSES, (batch_size,), generator=generator)
    return token_ids, labels


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    token_ids, labels = batch
    return F.cross_entropy(model(token_ids), labels)
