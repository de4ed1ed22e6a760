"""A Lightning module as people write it when they first add a batch size: ``self.batch_size`` is there, but the
DataLoader still reads a number of its own, so every batch holds 4 samples whatever the batch size is set to."""

from __future__ import annotations

import torch
from lightning.pytorch import LightningModule
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class FixedLoader(LightningModule):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.batch_size = 8
        self.layers = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.layers(x), y)

    def train_dataloader(self) -> DataLoader:
        data = TensorDataset(torch.randn(64, self.hparams.width), torch.randint(0, 4, (64,)))
        return DataLoader(data, batch_size=4)  # not self.batch_size

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)
