"""A decoder-only transformer whose memory depends on the sequence length: tune it at several lengths.

autobatch imports this file (never as ``__main__``) and calls ``build_model()``,
``make_batch(batch_size, seq_len)`` and ``compute_loss(model, batch)``; it runs backward, the optimizer
step and ``zero_grad`` itself. ``make_batch`` takes the length as its second parameter, so one tune finds
the largest batch at every length the job will see::

    autobatch tune examples/transformer_lengths.py --device cpu --memory 1GiB \\
        --seq-len 128 --seq-len 256 --seq-len 512 -- --attention eager

Memory at ``B`` sequences of ``L`` tokens is close to ``a + b·B·L + c·B·L²``. The ``L²`` term is the
attention's scores: ``--attention eager`` writes attention out as minGPT does (``q @ kᵀ``, scaled, the
causal mask, softmax, ``@ v``) and keeps a ``(batch, heads, L, L)`` softmax for backward in every block;
``--attention sdpa`` calls ``F.scaled_dot_product_attention(is_causal=True)``, whose kernels keep none.

The model: token embedding and learned positions (``--max-len`` of them, the longest length it takes),
an ``nn.ModuleList`` of ``--depth`` pre-LayerNorm ``Block`` modules (causal self-attention, then a 4x GELU
MLP in an ``nn.Sequential``, each with a residual connection), a final LayerNorm and a head over
``--vocab`` tokens. No dropout, so that recomputation gives the same gradients.

Running this file directly (``python examples/transformer_lengths.py``) trains a few steps, which
autobatch never does.
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
    parser = argparse.ArgumentParser(description="transformer at several lengths", allow_abbrev=False)
    parser.add_argument(
        "--attention",
        choices=("eager", "sdpa"),
        default="eager",
        help="eager: softmax(q @ k^T) kept for backward (memory in L^2); sdpa: F.scaled_dot_product_attention",
    )
    parser.add_argument("--vocab", type=int, default=512, help="vocabulary size")
    parser.add_argument("--width", type=int, default=64, help="embedding width")
    parser.add_argument("--depth", type=int, default=4, help="number of transformer blocks")
    parser.add_argument("--heads", type=int, default=2, help="attention heads per block")
    parser.add_argument("--max-len", type=int, default=1024, help="positions: the longest sequence")
    args, _unknown = parser.parse_known_args(argv)
    if args.width % args.heads:
        parser.error(f"--width {args.width} is not a multiple of --heads {args.heads}")
    return args


# Parsed at import time: autobatch passes the arguments after `--` as sys.argv[1:].
ARGS = parse_args(sys.argv[1:])

# Optional: the block class that activation recomputation wraps.
RECOMPUTE_CLASSES = ("Block",)


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, max_len: int, attention: str) -> None:
        super().__init__()
        self.heads = heads
        self.attention = attention
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        if attention == "eager":
            # minGPT's causal mask for the whole context (a bool, not saved with the weights)
            mask = torch.tril(torch.ones(max_len, max_len, dtype=torch.bool))
            self.register_buffer("mask", mask.view(1, 1, max_len, max_len), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        # (batch, length, width) -> (batch, heads, length, width // heads)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            scores = scores.masked_fill(~self.mask[:, :, :length, :length], float("-inf"))
            y = F.softmax(scores, dim=-1) @ v  # the (batch, heads, L, L) softmax is kept for backward
        return self.proj(y.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    """One pre-LayerNorm transformer block: the unit that activation recomputation wraps."""

    def __init__(self, width: int, heads: int, max_len: int, attention: str) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, max_len, attention)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(args.vocab, args.width)
        self.position_embedding = nn.Embedding(args.max_len, args.width)
        self.blocks = nn.ModuleList(
            Block(args.width, args.heads, args.max_len, args.attention) for _ in range(args.depth)
        )
        self.ln_f = nn.LayerNorm(args.width)
        self.head = nn.Linear(args.width, args.vocab, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def build_model() -> nn.Module:
    return Transformer(ARGS)


def make_batch(batch_size: int, seq_len: int = 256) -> dict[str, torch.Tensor]:
    """``batch_size`` sequences of ``seq_len`` random tokens; the targets are the next tokens."""
    if seq_len > ARGS.max_len:
        raise ValueError(f"seq_len {seq_len} exceeds the model's {ARGS.max_len} positions (--max-len)")
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, ARGS.vocab, (batch_size, seq_len + 1), generator=generator)
    return {"tokens": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}


def compute_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(batch["tokens"])
    return F.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten())


if __name__ == "__main__":
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = make_batch(4, 128)
    for step in range(3):
        loss = compute_loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: loss {loss.item():.4f}")
