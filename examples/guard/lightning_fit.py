"""Lightning's ``Trainer.fit`` with the runtime guard: a small classifier on random vectors.

The ``Guarded`` callback splits each loader batch (``--batch``) into micro-batches of ``--micro`` samples and,
when memory runs out, lowers the micro-batch and runs the same batch again; the optimizer still steps once per
batch. Try it on the CPU with an out-of-memory failure injected at batch 2 (the guard's test hook)::

    AUTOBATCH_GUARD_FAIL_AT=2 python examples/guard/lightning_fit.py

``--reference`` trains the same data without the guard, with Lightning's own accumulation at micro-batch 1;
both runs save their parameters to ``OUT/params.pt`` so they can be compared. (With ``AutoBatch(guard=True)``
instead of ``Guarded``, the plan and the guard come from a tune when ``fit`` starts.)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from autobatch import Guard
from autobatch.integrations.lightning import Guarded

parser = argparse.ArgumentParser(description="Lightning Trainer.fit with autobatch's guard")
parser.add_argument("--batch", type=int, default=8, help="samples per optimizer step")
parser.add_argument("--micro", type=int, default=4, help="the micro-batch the guard starts at")
parser.add_argument("--steps", type=int, default=5, help="optimizer steps")
parser.add_argument(
    "--reference", action="store_true", help="no guard: Lightning accumulation at micro-batch 1"
)
parser.add_argument("--out", default="guard-lightning-out", help="output folder")
ARGS = parser.parse_args()

# Data prepared at import: 16 vectors of 32 features per sample, four classes.
generator = torch.Generator().manual_seed(0)
DATA = TensorDataset(
    torch.randn(ARGS.batch * ARGS.steps, 16, 32, generator=generator),
    torch.randint(0, 4, (ARGS.batch * ARGS.steps,), generator=generator),
)


class Classifier(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 4)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.head(self.body(x).mean(dim=1)), y)  # a mean over samples

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Report(Callback):
    """Prints what the guard did with every batch."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]
        done = self.guard.last
        print(
            f"step {done.step}: {done.samples} samples, micro-batch {done.micro_batch_size}, "
            f"attempts {done.attempts}, loss {done.loss:.4f}",
            flush=True,
        )


def main() -> Classifier:
    Path(ARGS.out).mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = Classifier()
    common = dict(accelerator="cpu", devices=1, max_steps=ARGS.steps, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, default_root_dir=ARGS.out)  # fmt: skip
    if ARGS.reference:
        trainer = Trainer(accumulate_grad_batches=ARGS.batch, **common)
        trainer.fit(model, DataLoader(DATA, batch_size=1))
    else:
        guard = Guard(ARGS.micro, batch_size=ARGS.batch, sizes=[1, 2, ARGS.micro],
                      events=Path(ARGS.out) / "events.jsonl")  # fmt: skip
        with guard:
            trainer = Trainer(callbacks=[Guarded(guard), Report(guard)], **common)
            trainer.fit(model, DataLoader(DATA, batch_size=ARGS.batch))
        print(
            f"guard: {guard.summary.steps} batches, {guard.summary.out_of_memory} out of memory", flush=True
        )
    torch.save({k: v.detach() for k, v in model.state_dict().items()}, Path(ARGS.out) / "params.pt")
    return model


if __name__ == "__main__":
    main()
