"""A multilayer perceptron classifier on random data: the smallest complete autobatch script.

autobatch imports this file (never as ``__main__``) and calls the three functions of its contract:

* ``build_model()`` builds the model on the CPU; autobatch moves it to the device and applies the precision.
* ``make_batch(batch_size)`` returns one batch with the WORST-CASE shapes the real job will see. autobatch
  measures memory on exactly these tensors, so a batch smaller than the job's largest would give a
  maximum that runs out of memory later. Here every sample has the same shape, so any batch is the worst.
* ``compute_loss(model, batch)`` returns a scalar loss. autobatch runs backward, the optimizer step and
  ``zero_grad`` itself, so that it can vary the precision, the optimizer and activation recomputation.

The model is ``depth`` blocks of Linear + ReLU of ``width`` features, run on each of ``tokens`` feature
vectors per sample, mean-pooled, and a 1000-class head. Per sample it keeps ``tokens x width`` values per
block for backward (about 3.6 MiB with the defaults), so a MiB of run-to-run noise at the memory boundary
moves the maximum by less than a sample. With ``--tokens 1`` it is a plain MLP whose per-sample cost is a
few KiB: its exact boundary is then below what the CPU device can reproduce across processes.
Script arguments go after ``--`` on the autobatch command line::

    autobatch tune examples/mlp.py --device cpu --memory 1GiB -- --width 512 --depth 2

Running this file directly (``python examples/mlp.py``) trains a few steps, which autobatch never does.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch import nn


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Read this script's own arguments; arguments it does not know are left to whoever owns them."""
    parser = argparse.ArgumentParser(description="MLP example for autobatch", allow_abbrev=False)
    parser.add_argument("--in-features", type=int, default=256, help="input features per sample")
    parser.add_argument("--width", type=int, default=256, help="hidden features of every block")
    parser.add_argument(
        "--tokens",
        type=int,
        default=256,
        help="feature vectors per sample (the MLP runs on each, then pools)",
    )
    parser.add_argument("--depth", type=int, default=4, help="number of Linear + ReLU blocks")
    parser.add_argument("--classes", type=int, default=1000, help="number of output classes")
    args, _unknown = parser.parse_known_args(argv)
    return args


# Parsed at import time: autobatch passes the arguments after `--` as sys.argv[1:].
ARGS = parse_args(sys.argv[1:])

# Optional: the block class autobatch wraps in activation checkpointing when recomputation is on.
# Without it, autobatch picks the repeated children of an nn.ModuleList / nn.Sequential.
RECOMPUTE_CLASSES = ("Block",)


class Block(nn.Module):
    """Linear followed by ReLU: the unit that activation recomputation wraps."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.linear(x))


class MLP(nn.Module):
    def __init__(self, in_features: int, width: int, depth: int, classes: int) -> None:
        super().__init__()
        sizes = [in_features] + [width] * depth
        self.blocks = nn.ModuleList(Block(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=False))
        self.head = nn.Linear(sizes[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (batch, tokens, in_features); the blocks run on every token, then the tokens are pooled.
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=1))


def build_model() -> nn.Module:
    return MLP(ARGS.in_features, ARGS.width, ARGS.depth, ARGS.classes)


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random features and labels; a fixed seed keeps probes comparable."""
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(batch_size, ARGS.tokens, ARGS.in_features, generator=generator)
    labels = torch.randint(0, ARGS.classes, (batch_size,), generator=generator)
    return features, labels


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    features, labels = batch
    return F.cross_entropy(model(features), labels)


if __name__ == "__main__":
    import os

    # A job that autobatch calibrated reads its plan from the environment (scripts/calibrate_and_train.sh).
    micro_batch = int(os.environ.get("AUTOBATCH_MICRO_BATCH_SIZE", "32"))
    print(f"micro-batch {micro_batch}")
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = make_batch(micro_batch)
    for step in range(3):
        loss = compute_loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: loss {loss.item():.4f}")
