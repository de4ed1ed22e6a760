"""A transformer text classifier: the levers between recomputation on and off.

autobatch imports this file (never as ``__main__``) and calls ``build_model()``, ``make_batch(batch_size)``
and ``compute_loss(model, batch)``; it runs backward, the optimizer step and ``zero_grad`` itself.

The model is written the way encoders often are: a token embedding and learned positions, an
``nn.ModuleList`` of ``--depth`` ``Block`` modules (pre-LayerNorm self-attention written out by hand,
with the padding masked, then an MLP in an ``nn.Sequential``), and a classifier on the mean of the tokens
that are not padding. The data is prepared at import, as scripts do: short texts of random lengths (a
sentence or a review), padded to ``--max-len``. ``make_batch`` returns the worst case the job will see:
every sample at the longest length.

What that makes of its memory and time, which is what the example is for:

* Each sample is short and the model narrow, so a step of a few samples runs little work per operation,
  and a micro-batch of six does not use the CPU (or a GPU) as well as one of twelve: accumulating small
  micro-batches costs time, not only steps.
* Each block keeps its attention weights (heads x length x length per sample), its dropout masks and its
  MLP's activations for the backward, so the blocks hold most of a sample's memory: checkpointing every
  block multiplies the largest batch, and checkpointing the first K of them moves it about linearly in K.

So under a global batch a little above what fits without recomputation, checkpointing a few of the blocks
runs it in one step, faster than accumulating two half batches and faster than checkpointing them all::

    autobatch tune examples/text_classifier.py --device cpu --memory 420MiB -p 32-true -o adamw \\
        --objective throughput --global-batch-size 12

Running this file directly (``python examples/text_classifier.py``) trains a few steps, which autobatch
never does.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch
import torch.nn.functional as F
from torch import nn


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Read this script's own arguments; arguments it does not know are left to whoever owns them."""
    parser = argparse.ArgumentParser(description="text classifier example for autobatch", allow_abbrev=False)
    parser.add_argument("--vocab", type=int, default=8192, help="vocabulary size")
    parser.add_argument("--max-len", type=int, default=32, help="the longest text, in tokens")
    parser.add_argument("--width", type=int, default=64, help="embedding width")
    parser.add_argument("--depth", type=int, default=24, help="number of transformer blocks")
    parser.add_argument("--heads", type=int, default=4, help="attention heads per block")
    parser.add_argument("--classes", type=int, default=4, help="number of labels")
    parser.add_argument("--dropout", type=float, default=0.1, help="dropout of attention weights and outputs")
    parser.add_argument("--texts", type=int, default=4096, help="texts in the (random) dataset")
    args, _unknown = parser.parse_known_args(argv)
    if args.width % args.heads:
        parser.error(f"--width {args.width} is not a multiple of --heads {args.heads}")
    return args


# Parsed at import time: autobatch passes the arguments after `--` as sys.argv[1:].
ARGS = parse_args(sys.argv[1:])

# Optional: the block class that activation recomputation wraps (autobatch would also find it by itself, as
# the repeated children of `blocks`, an nn.ModuleList); a level K/N checkpoints the first K of them.
RECOMPUTE_CLASSES = ("Block",)


def _dataset(texts: int, max_len: int, vocab: int, classes: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random texts of 8 to ``max_len`` tokens (id 0 is padding), padded to ``max_len``, and their labels."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, max_len + 1, (texts,), generator=generator)
    ids = torch.randint(1, vocab, (texts, max_len), generator=generator)
    ids[torch.arange(max_len) >= lengths[:, None]] = 0
    labels = torch.randint(0, classes, (texts,), generator=generator)
    return ids, lengths, labels


# Prepared at import, as training scripts do.
IDS, LENGTHS, LABELS = _dataset(ARGS.texts, ARGS.max_len, ARGS.vocab, ARGS.classes)


class SelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(width // self.heads))
        weights = self.dropout(scores.masked_fill(padding[:, None, None, :], float("-inf")).softmax(dim=-1))
        return self.proj((weights @ v).transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    """One pre-LayerNorm encoder block: the unit that activation recomputation wraps."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = SelfAttention(width, heads, dropout)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attention(self.norm1(x), padding))
        return x + self.mlp(self.norm2(x))


class Classifier(nn.Module):
    def __init__(
        self, vocab: int, max_len: int, width: int, depth: int, heads: int, classes: int, dropout: float
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width, padding_idx=0)
        self.positions = nn.Parameter(torch.zeros(max_len, width))
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        padding = ids == 0
        x = self.embed(ids) + self.positions[: ids.shape[1]]
        for block in self.blocks:
            x = block(x, padding)
        keep = (~padding).unsqueeze(-1).to(x.dtype)
        pooled = (self.norm(x) * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1.0)
        return self.head(pooled)


def build_model() -> nn.Module:
    args = ARGS
    return Classifier(
        args.vocab, args.max_len, args.width, args.depth, args.heads, args.classes, args.dropout
    )


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` texts at the longest length (the worst case), cycling through the dataset."""
    rows = torch.arange(batch_size) % len(IDS)
    ids = IDS[rows].clone()
    ids[ids == 0] = 1  # every text at the longest length: no padding
    return ids, LABELS[rows]


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    ids, labels = batch
    return F.cross_entropy(model(ids), labels)


if __name__ == "__main__":
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step in range(3):
        order = torch.randperm(len(IDS))[:16]
        loss = F.cross_entropy(model(IDS[order, : int(LENGTHS[order].max())]), LABELS[order])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: loss {loss.item():.4f}")
