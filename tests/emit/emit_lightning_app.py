"""A tiny LightningModule and data modules for loading the Lightning overlay with LightningCLI."""

from __future__ import annotations

import lightning.pytorch as pl
import torch


class TinyModel(pl.LightningModule):
    def __init__(self, hidden: int = 4) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(hidden, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class TinyData(pl.LightningDataModule):
    def __init__(self, batch_size: int = 1, num_workers: int = 0) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.num_workers = num_workers


class MicroBatchData(pl.LightningDataModule):
    """A data module whose batch-size argument has another name."""

    def __init__(self, micro_batch: int = 1) -> None:
        super().__init__()
        self.micro_batch = micro_batch
