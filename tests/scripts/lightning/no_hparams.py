"""A Lightning training script as people write it: the module's constructor takes its width and depth and
never calls save_hyperparameters(), so the AutoBatch callback ships the module itself (its weights, drawn at
random in each run) to the probes. Prints the result's cache record as JSON on its last line."""

from __future__ import annotations

import json
import sys

import torch
from lightning.pytorch import LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from autobatch.integrations.lightning import AutoBatch


class Classifier(LightningModule):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(nn.Linear(width, width) for _ in range(depth)), nn.Linear(width, 4))
        self.batch_size = 2
        self.width = width

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.layers(x), y)

    def train_dataloader(self) -> DataLoader:
        data = TensorDataset(torch.zeros(32, self.width), torch.zeros(32, dtype=torch.long))
        return DataLoader(data, batch_size=self.batch_size)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    callback = AutoBatch(memory=sys.argv[1] if len(sys.argv) > 1 else "1GiB", confirm_steps=6)
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
    )  # fmt: skip
    trainer.fit(Classifier(width=64, depth=2))
    assert callback.result is not None
    print(json.dumps(callback.result.cache))
