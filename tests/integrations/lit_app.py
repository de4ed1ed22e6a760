"""A small LightningModule and DataModule, as a user writes them, for the Lightning adapter's tests.

The batch size lives where Lightning's BatchSizeFinder looks for it: the data module's ``batch_size``
(an attribute and, through ``save_hyperparameters``, an hparam). ``training_step`` logs and records the
size of every batch it sees, so a test can tell what a real ``Trainer.fit`` trained with.
"""

from __future__ import annotations

import torch
from lightning.pytorch import LightningDataModule, LightningModule
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) + x


class LitMLP(LightningModule):
    """An MLP over ``tokens`` vectors per sample, so that activations grow quickly with the batch."""

    def __init__(self, width: int = 32, depth: int = 3, classes: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, classes)
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).mean(dim=1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.seen.append(len(x))
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class LitData(LightningDataModule):
    """Random vectors: ``samples`` of ``tokens`` x ``width``, ``batch_size`` per batch."""

    def __init__(
        self, width: int = 32, tokens: int = 64, classes: int = 4, samples: int = 2048, batch_size: int = 2
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.batch_size = batch_size
        self.data: TensorDataset | None = None

    def setup(self, stage: str) -> None:
        gen = torch.Generator().manual_seed(0)
        h = self.hparams
        self.data = TensorDataset(
            torch.randn(h.samples, h.tokens, h.width, generator=gen),
            torch.randint(0, h.classes, (h.samples,), generator=gen),
        )

    def train_dataloader(self) -> DataLoader:
        assert self.data is not None
        return DataLoader(self.data, batch_size=self.batch_size)


class NoBatchSize(LightningDataModule):
    """A data module whose batch size autobatch cannot set (it is fixed inside the dataloader)."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            TensorDataset(torch.randn(64, 8, 32), torch.zeros(64, dtype=torch.long)), batch_size=4
        )


class Holder(LightningDataModule):
    """A data module built from an object, without save_hyperparameters."""

    def __init__(self, values: torch.Tensor) -> None:
        super().__init__()
        self.values = values


class ManualStep(LitMLP):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
