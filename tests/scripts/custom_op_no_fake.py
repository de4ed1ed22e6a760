"""Fixture: a model that trains eagerly and does not compile: its activation is a custom operator without a fake
implementation.

``squareplus`` (x + sqrt(x^2 + 4)) / 2 is computed in NumPy, the usual reason for wrapping code in
``torch.library.custom_op``: an operator torch cannot see into. Its backward is registered, so eager training
works; its fake implementation (``squareplus.register_fake``, the output's shape and dtype for tracing) is
not, so ``torch.compile`` fails while Dynamo traces the first forward, every time, whatever the batch:
Dynamo raises ``TorchRuntimeError`` ("There was no fake impl registered for ..."), which is no graph break.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

FEATURES, WIDTH, CLASSES = 64, 256, 10


@torch.library.custom_op("autobatch_fixture::squareplus", mutates_args=())
def squareplus(x: torch.Tensor) -> torch.Tensor:
    a = x.detach().cpu().numpy()
    return torch.from_numpy((a + np.sqrt(a * a + 4.0)) / 2.0).to(x.device)


def _backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    (x,) = ctx.saved_tensors
    return grad * (1.0 + x / torch.sqrt(x * x + 4.0)) / 2.0


def _save(ctx, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:  # noqa: ANN001
    ctx.save_for_backward(inputs[0])


squareplus.register_autograd(_backward, setup_context=_save)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(FEATURES, WIDTH)
        self.out = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(squareplus(self.hidden(x)))


def build_model() -> nn.Module:
    return Net()


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(batch_size, FEATURES, generator=generator)
    return features, torch.randint(0, CLASSES, (batch_size,), generator=generator)


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    features, labels = batch
    return F.cross_entropy(model(features), labels)
