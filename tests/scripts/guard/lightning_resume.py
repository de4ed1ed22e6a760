"""Lightning's ``Trainer.fit`` under the guard (``Guarded``), checkpointing every 3 steps with ``ModelCheckpoint``
and resumed from the last one (``--resume``: ``fit(ckpt_path="last")``), as a job on a preemptible cluster runs.
Prints one JSON line per batch: Lightning's global step, the guard's step and its micro-batch.
``AUTOBATCH_GUARD_FAIL_AT`` lowers the guard.
"""

import argparse
import json

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import autobatch
from autobatch.integrations.lightning import Guarded

parser = argparse.ArgumentParser()
parser.add_argument("--max-steps", type=int, default=8)
parser.add_argument("--resume", action="store_true")
args = parser.parse_args()

generator = torch.Generator().manual_seed(0)
DATA = TensorDataset(
    torch.randn(64, 32, generator=generator), torch.randint(0, 4, (64,), generator=generator)
)


class Classifier(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Report(Callback):
    def __init__(self, guard: autobatch.Guard) -> None:
        self.guard = guard

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]
        done = self.guard.last
        print(
            json.dumps(
                {
                    "global_step": trainer.global_step - 1,
                    "guard_step": done.step,
                    "micro": done.micro_batch_size,
                }
            )
        )


guard = autobatch.Guard(8, batch_size=8, sizes=[2, 4], settings=autobatch.LadderSettings(grow_after=20))
checkpoints = ModelCheckpoint(dirpath="checkpoints", every_n_train_steps=3, save_last=True)
trainer = Trainer(
    accelerator="cpu", devices=1, max_steps=args.max_steps, logger=False, enable_progress_bar=False,
    enable_model_summary=False, callbacks=[Guarded(guard), Report(guard), checkpoints],
)  # fmt: skip
torch.manual_seed(0)
trainer.fit(Classifier(), DataLoader(DATA, batch_size=8), ckpt_path="last" if args.resume else None)
