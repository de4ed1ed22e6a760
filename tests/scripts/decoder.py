"""Fixture: a 12-block decoder written the way people write one, whose blocks keep their MLP in a Sequential.

Token embedding and learned positions, an ``nn.ModuleList`` of 12 ``Block`` modules (pre-LayerNorm causal
self-attention written out as minGPT writes it, then an MLP in an ``nn.Sequential(Linear, GELU,
Linear)``), a final LayerNorm and a language-model head. No ``RECOMPUTE_CLASSES``: autobatch finds the
blocks itself. The 24 ``Linear`` layers in the blocks' Sequentials outnumber the 12 blocks, and
checkpointing one ``Linear`` saves nothing (it keeps its input either way); checkpointing the blocks
keeps only their inputs and more than doubles the maximum batch.

Each attention holds what a decoder that also generates holds and no training step touches: its causal
mask for the whole context (minGPT's ``bias`` buffer) and a key/value cache for generation (as Llama's
reference implementation allocates it). That static memory leaves about 150 MiB of a 1 GiB cap to the
activations, so a tune on the CPU is quick.

Its size is set on the command line (``--depth``, ``--vocab``, ``--context``; after ``--`` for autobatch):
the defaults above, or a smaller decoder for a quicker test.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser(description="a decoder that keeps its blocks' MLP in a Sequential")
parser.add_argument("--depth", type=int, default=12, help="blocks")
parser.add_argument("--vocab", type=int, default=4096, help="words in the vocabulary")
parser.add_argument("--context", type=int, default=2048, help="the longest sequence generated")
args = parser.parse_args()

VOCAB, WIDTH, HEADS, DEPTH, TOKENS = args.vocab, 64, 4, args.depth, 128
CONTEXT, GENERATION_BATCH = args.context, 16  # the longest sequence generated, and how many at once


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.register_buffer("mask", torch.ones(CONTEXT, CONTEXT).tril())
        self.cache_k = torch.zeros(GENERATION_BATCH, CONTEXT, width)  # used by generation only
        self.cache_v = torch.zeros(GENERATION_BATCH, CONTEXT, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(width // self.heads))
        attention = scores.masked_fill(self.mask[:tokens, :tokens] == 0, float("-inf")).softmax(dim=-1)
        return self.proj((attention @ v).transpose(1, 2).reshape(batch, tokens, width))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = Attention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Parameter(torch.zeros(CONTEXT, WIDTH))
        self.blocks = nn.ModuleList(Block(WIDTH, HEADS) for _ in range(DEPTH))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.positions[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build_model() -> nn.Module:
    return Decoder()


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (batch_size, TOKENS + 1), generator=generator)
    return ids[:, :-1], ids[:, 1:]


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    ids, targets = batch
    return F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
