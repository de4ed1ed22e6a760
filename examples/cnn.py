"""A small convolutional image classifier with BatchNorm, on random 3x64x64 images.

autobatch imports this file (never as ``__main__``) and calls ``build_model()``, ``make_batch(batch_size)``
and ``compute_loss(model, batch)``; it runs backward, the optimizer step and ``zero_grad`` itself.

``make_batch`` must return the WORST-CASE shapes the real job will see: the peak memory of a convolutional
network grows with the image area, so if the job trains on mixed resolutions, make the batch at the
largest one (``--image-size``). A maximum measured on smaller images runs out of memory on the larger.

The network is a stem convolution and three stages of repeated ``Block`` (Conv2d 3x3 + BatchNorm2d + ReLU,
residual), each stage halving the resolution and doubling the channels, then global average pooling and a
linear classifier. Most of its memory is activations kept for backward, largest in the first stage, so
activation recomputation (which re-runs each ``Block`` during backward instead of keeping its
intermediates) buys a larger batch. BatchNorm keeps running statistics as buffers: they are not
parameters and get no optimizer state. Script arguments go after ``--`` on the autobatch command line::

    autobatch tune examples/cnn.py --device cpu --memory 1GiB -- --image-size 96 --channels 32

Running this file directly (``python examples/cnn.py``) trains a few steps, which autobatch never does.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch import nn


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Read this script's own arguments; arguments it does not know are left to whoever owns them."""
    parser = argparse.ArgumentParser(description="CNN example for autobatch", allow_abbrev=False)
    parser.add_argument("--image-size", type=int, default=64, help="height and width of the (largest) images")
    parser.add_argument(
        "--channels", type=int, default=16, help="channels of the first stage (doubled per stage)"
    )
    parser.add_argument("--depth", type=int, default=2, help="blocks per stage")
    parser.add_argument("--classes", type=int, default=100, help="number of output classes")
    args, _unknown = parser.parse_known_args(argv)
    return args


# Parsed at import time: autobatch passes the arguments after `--` as sys.argv[1:].
ARGS = parse_args(sys.argv[1:])

# Optional: the repeated block class that activation recomputation wraps (this is also what autobatch
# would detect by itself, as the repeated children of the stages' nn.Sequential).
RECOMPUTE_CLASSES = ("Block",)


class Block(nn.Module):
    """Conv2d 3x3 + BatchNorm2d + ReLU with a residual connection, at constant shape."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, padding=1, bias=False)
        self.norm = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.relu(self.norm(self.conv(x)))


def downsample(in_channels: int, out_channels: int) -> nn.Sequential:
    """Halve the resolution and change the channel count: Conv2d stride 2 + BatchNorm2d + ReLU."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(),
    )


class ConvNet(nn.Module):
    def __init__(self, channels: int, depth: int, classes: int) -> None:
        super().__init__()
        widths = [channels, 2 * channels, 4 * channels]
        self.stem = nn.Sequential(
            nn.Conv2d(3, channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
        )
        stages: list[nn.Module] = []
        for index, width in enumerate(widths):
            if index > 0:
                stages.append(downsample(widths[index - 1], width))
            stages.append(nn.Sequential(*(Block(width) for _ in range(depth))))
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.stages(self.stem(images))
        return self.head(features.mean(dim=(2, 3)))


def build_model() -> nn.Module:
    return ConvNet(ARGS.channels, ARGS.depth, ARGS.classes)


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images at the largest resolution and random labels; a fixed seed keeps probes comparable."""
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch_size, 3, ARGS.image_size, ARGS.image_size, generator=generator)
    labels = torch.randint(0, ARGS.classes, (batch_size,), generator=generator)
    return images, labels


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)


if __name__ == "__main__":
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = make_batch(16)
    for step in range(3):
        loss = compute_loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: loss {loss.item():.4f}")
