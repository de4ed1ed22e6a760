"""Fixture: a small vision transformer on random 3x64x64 images, written the usual way.

A strided convolution cuts each image into 8x8 patches (64 tokens), a class token and learned positions are
added, six pre-norm ``nn.TransformerEncoderLayer`` blocks follow, and a linear head reads the class token.
Under a 1 GiB cap with AdamW in fp32 the parameters are small and the activations decide: the maximum batch
is in the low hundreds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

IMAGE, PATCH, WIDTH, HEADS, DEPTH, CLASSES = 64, 8, 64, 4, 6, 100


class ViT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        tokens = (IMAGE // PATCH) ** 2
        self.patches = nn.Conv2d(3, WIDTH, kernel_size=PATCH, stride=PATCH)
        self.cls = nn.Parameter(torch.zeros(1, 1, WIDTH))
        self.positions = nn.Parameter(torch.randn(1, tokens + 1, WIDTH) * 0.02)
        layer = nn.TransformerEncoderLayer(
            WIDTH, HEADS, 4 * WIDTH, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, DEPTH, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patches(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], dim=1) + self.positions
        return self.head(self.norm(self.blocks(x))[:, 0])


def build_model() -> nn.Module:
    return ViT()


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 3, IMAGE, IMAGE), torch.randint(0, CLASSES, (batch_size,))


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)
