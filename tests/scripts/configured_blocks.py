"""Fixture: a stack of residual blocks whose width and depth come from ``model.json`` beside the script, read at
import, as people configure a script.

Each process that imports it, builds the model or a batch notes it (``import PID``, ``build PID``, ``batch PID``)
in the file the ``BUILDS_LOG`` variable names, outside the working folder: a process that built the model and
never a batch is an inspection; one that imported the script and built nothing, the probe server's check of its
import.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

CONFIG = json.loads((Path(__file__).parent / "model.json").read_text())


def _note(what: str) -> None:
    with open(os.environ["BUILDS_LOG"], "a") as log:
        log.write(f"{what} {os.getpid()}\n")


_note("import")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.inner = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.inner(x))


def build_model() -> nn.Module:
    _note("build")
    width = CONFIG["width"]
    blocks = (Block(width) for _ in range(CONFIG["depth"]))
    return nn.Sequential(nn.Linear(32, width), *blocks, nn.Linear(width, 10))


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    _note("batch")
    return torch.randn(batch_size, 32), torch.randint(0, 10, (batch_size,))


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels)
