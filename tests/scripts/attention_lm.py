"""Fixture: a tiny language model whose attention either materialises its scores or does not.

Two pre-LayerNorm blocks of causal self-attention and an MLP, ``make_batch(batch_size, seq_len)`` (the
length is the second parameter). ``--attention eager`` (the default) writes the attention out as minGPT
does: ``softmax(q @ k^T)`` keeps a ``(batch, heads, L, L)`` tensor per layer for backward, the ``L²`` term
of a step's memory. ``--attention sdpa`` calls ``F.scaled_dot_product_attention(is_causal=True)``, whose
fused kernels keep no ``(L, L)`` tensor. Small enough that explain and estimate run in seconds under a
512 MiB cap: a narrow width and a small vocabulary, so that at a few hundred tokens the scores dominate.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--attention", choices=("eager", "sdpa"), default="eager")
ATTENTION = parser.parse_args().attention

VOCAB, WIDTH, HEADS, DEPTH, CONTEXT = 256, 48, 4, 2, 1024


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, HEADS, width // HEADS).permute(2, 0, 3, 1, 4)
        if ATTENTION == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(width // HEADS))
            causal = torch.ones(tokens, tokens, dtype=torch.bool, device=x.device).tril()
            out = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, width))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH)
        self.attention = Attention()
        self.norm2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class LM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Parameter(torch.zeros(CONTEXT, WIDTH))
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.positions[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build_model() -> nn.Module:
    return LM()


def make_batch(batch_size: int, seq_len: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (batch_size, seq_len + 1), generator=generator)
    return ids[:, :-1], ids[:, 1:]


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    ids, targets = batch
    return F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
