"""Worker: Lightning's ``Tuner(trainer).scale_batch_size`` on a workload, under autobatch's CPU cap.

The workload's ``build_model``/``make_batch``/``compute_loss`` are wrapped in a LightningModule with a
``batch_size`` attribute (what the tuner scales) whose ``train_dataloader`` yields ``make_batch(batch_size)``
batches, trained with AdamW (``torch.optim`` defaults) on the CPU at ``32-true``. The tuner runs
``steps_per_trial`` full steps per trial (at least 3, so that AdamW's state is resident), starting from
its default ``init_val`` 2, with ``max_trials`` high enough not to stop the search early. Everything
else is Lightning's default, including binsearch's 5 % safety margin on its answer (the record keeps
the largest size that succeeded before the margin, too).

Request options: ``mode`` ("binsearch" | "power"), ``steps_per_trial``, ``max_trials``, ``root`` (a
scratch folder for the tuner's own checkpoint).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import lightning.pytorch as pl  # imported before the cap: imports count, as in autobatch's probes
import torch
from torch.utils.data import DataLoader, IterableDataset

from .common import Record, Request, Tries, run_worker, setup


class Batches(IterableDataset):  # type: ignore[type-arg]
    """Endless ``make_batch(batch_size)`` batches (iterable: the tuner never caps the size at a length)."""

    def __init__(self, make_batch: Any, batch_size: int) -> None:
        self.make_batch = make_batch
        self.batch_size = batch_size

    def __iter__(self) -> Any:
        while True:
            yield self.make_batch(self.batch_size)


class Wrapped(pl.LightningModule):
    """A workload as a LightningModule: the model, its loss, AdamW, and a scalable ``batch_size``."""

    def __init__(self, script: Any) -> None:
        super().__init__()
        self.script = script
        self.model = script.build_model()
        self.batch_size = 2
        self.succeeded: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.script.compute_loss(self.model, batch)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx + 1 >= self.trainer.fit_loop.epoch_loop.max_steps:
            self.succeeded.append(self.batch_size)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters())

    def train_dataloader(self) -> DataLoader:  # type: ignore[type-arg]
        return DataLoader(Batches(self.script.make_batch, self.batch_size), batch_size=None)


def count_trials(tries: Tries) -> None:
    """Record the batch size of every trial: wrap the tuner's one-trial function (``_try_loop_run``)."""
    from lightning.pytorch.tuner import batch_size_scaling as scaling

    run_one = scaling._try_loop_run

    def counted(trainer: pl.Trainer, params: dict[str, Any]) -> None:
        tries.sizes.append(int(trainer.lightning_module.batch_size))
        run_one(trainer, params)

    scaling._try_loop_run = counted


def body(request: Request, record: Record, tries: Tries) -> None:
    options = request.options
    mode = str(options.get("mode", "binsearch"))
    steps = int(options.get("steps_per_trial", 3))
    record.method = f"lightning-{mode}"
    record.extra.update(mode=mode, steps_per_trial=steps)
    script = setup(request, record)
    from lightning.pytorch.tuner import Tuner

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        precision="32-true",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(options.get("root", ".")),
    )
    count_trials(tries)
    module = Wrapped(script)
    try:
        record.found = Tuner(trainer).scale_batch_size(
            module,
            mode=mode,
            steps_per_trial=steps,
            init_val=2,
            max_trials=int(options.get("max_trials", 50)),
        )
    finally:
        record.extra["largest_succeeded"] = max(module.succeeded, default=None)
        record.extra["succeeded"] = module.succeeded


if __name__ == "__main__":
    run_worker("lightning", body)
