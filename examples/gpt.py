"""A small GPT-style language model: next-token prediction on random tokens at a fixed worst-case length.

autobatch imports this file (never as ``__main__``) and calls ``build_model()``, ``make_batch(batch_size)``
and ``compute_loss(model, batch)``; it runs backward, the optimizer step and ``zero_grad`` itself.

``make_batch`` must return the WORST-CASE shapes the real job will see. A language model's memory grows
with the sequence length (the logits alone are batch x length x vocabulary values), so the batch here is
always ``--seq-len`` tokens long: if the job packs or pads to a maximum length, use that length. A maximum
measured on shorter sequences runs out of memory on the first long one.

The model follows GPT-2: token embedding + learned positions, ``--depth`` repeated ``Block`` modules
(pre-LayerNorm causal self-attention through ``F.scaled_dot_product_attention`` and a 4x GELU MLP,
each with a residual connection), a final LayerNorm and a language-model head that shares its weight
with the token embedding. The batch is a dict of tensors, to show that nested batches work. Script
arguments go after ``--`` on the autobatch command line::

    autobatch tune examples/gpt.py --device cpu --memory 2GiB -- --seq-len 256 --vocab 8192

Running this file directly (``python examples/gpt.py``) trains a few steps, which autobatch never does.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch import nn


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Read this script's own arguments; arguments it does not know are left to whoever owns them."""
    parser = argparse.ArgumentParser(description="GPT example for autobatch", allow_abbrev=False)
    parser.add_argument("--vocab", type=int, default=4096, help="vocabulary size")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sequence (the job's maximum)")
    parser.add_argument("--width", type=int, default=128, help="embedding width")
    parser.add_argument("--depth", type=int, default=4, help="number of transformer blocks")
    parser.add_argument("--heads", type=int, default=4, help="attention heads per block")
    args, _unknown = parser.parse_known_args(argv)
    if args.width % args.heads:
        parser.error(f"--width {args.width} is not a multiple of --heads {args.heads}")
    return args


# Parsed at import time: autobatch passes the arguments after `--` as sys.argv[1:].
ARGS = parse_args(sys.argv[1:])

# Optional: the block class that activation recomputation wraps (autobatch would also find it by itself,
# as the repeated children of `blocks`, an nn.ModuleList).
RECOMPUTE_CLASSES = ("Block",)


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        # (batch, length, width) -> (batch, heads, length, width // heads)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    """One pre-LayerNorm transformer block: the unit that activation recomputation wraps."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def _init_weights(module: nn.Module) -> None:
    """GPT-2's initialisation: small weights keep the first logits (and their gradients) in a sane range."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


class GPT(nn.Module):
    def __init__(self, vocab: int, seq_len: int, width: int, depth: int, heads: int) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, width)
        self.position_embedding = nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.token_embedding.weight  # weight tying, as in GPT-2
        self.apply(_init_weights)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.token_embedding(input_ids) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def build_model() -> nn.Module:
    return GPT(ARGS.vocab, ARGS.seq_len, ARGS.width, ARGS.depth, ARGS.heads)


def make_batch(batch_size: int) -> dict[str, torch.Tensor]:
    """Random token ids at the maximum length; targets are the inputs shifted by one token."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, ARGS.vocab, (batch_size, ARGS.seq_len + 1), generator=generator)
    return {"input_ids": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}


def compute_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(batch["input_ids"])
    return F.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten())


if __name__ == "__main__":
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = make_batch(8)
    for step in range(3):
        loss = compute_loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: loss {loss.item():.4f}")
