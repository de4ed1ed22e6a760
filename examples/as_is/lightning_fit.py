"""A Lightning script as people write it: a ``LightningModule``, a ``DataLoader``, ``Trainer.fit``.

It defines none of autobatch's three functions: autobatch runs it as it is, as ``__main__``, with the batch
size in its arguments, and ends it after the optimizer steps each probe needs (Lightning steps the
``torch.optim.AdamW`` that ``configure_optimizers`` returns, and autobatch sees those steps)::

    autobatch tune examples/as_is/lightning_fit.py --device cpu --memory 1GiB -- --batch-size {batch}

``{batch}`` is the ``DataLoader``'s batch size. The model reads 256 tokens per sample and runs four
Linear + LayerNorm + GELU blocks of 128 features on each (about 2 MiB of activations per sample), so the
maximum under 1 GiB is a few hundred samples. The data set lives in the probe's memory as it does in the
job's, so it is kept small here (4 MiB). Run directly (``python examples/as_is/lightning_fit.py``), it trains.
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description="a LightningModule trained with Trainer.fit")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--samples", type=int, default=4096)
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()

TOKENS, VOCAB, WIDTH, CLASSES = 256, 2000, 128, 10


class Classifier(L.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.Sequential(*[self.block() for _ in range(4)])
        self.head = nn.Linear(WIDTH, CLASSES)

    @staticmethod
    def block() -> nn.Module:
        return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH), nn.GELU())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)).mean(dim=1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        tokens, labels = batch
        loss = F.cross_entropy(self(tokens), labels)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


L.seed_everything(0)
tokens = torch.randint(0, VOCAB, (args.samples, TOKENS), dtype=torch.int32)  # 4 MiB
labels = torch.randint(0, CLASSES, (args.samples,))
loader = DataLoader(TensorDataset(tokens, labels), batch_size=args.batch_size, shuffle=True)

trainer = L.Trainer(
    accelerator="cpu",
    devices=1,
    max_epochs=args.epochs,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
)
trainer.fit(Classifier(args.lr), train_dataloaders=loader)
