"""A plain loop with accelerate's ``Accelerator`` and the runtime guard: a small regression on random data.

The guard runs each loader batch (``--batch``) as micro-batches of ``--micro`` samples and, when memory runs
out, lowers the micro-batch and runs the same batch again; the optimizer still steps once per batch. Try it on
the CPU with an out-of-memory failure injected at batch 2 (the guard's test hook)::

    AUTOBATCH_GUARD_FAIL_AT=2 python examples/guard/accelerate_loop.py

``--reference`` trains the same data without the guard, with accelerate's own accumulation at micro-batch
1; both runs save their parameters to ``OUT/params.pt`` so they can be compared.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from autobatch import Guard

parser = argparse.ArgumentParser(description="accelerate with autobatch's guard")
parser.add_argument("--batch", type=int, default=8, help="samples per process per optimizer step")
parser.add_argument("--micro", type=int, default=4, help="the micro-batch the guard starts at")
parser.add_argument("--steps", type=int, default=5, help="optimizer steps")
parser.add_argument("--mixed-precision", default="no", choices=["no", "bf16", "fp16"])
parser.add_argument("--reference", action="store_true", help="no guard: accelerate accumulation at 1 sample")
parser.add_argument("--out", default="guard-accelerate-out", help="output folder")
ARGS = parser.parse_args()

# Data prepared at import: 16 vectors of 32 features per sample, one target per sample.
generator = torch.Generator().manual_seed(0)
DATA = TensorDataset(
    torch.randn(ARGS.batch * ARGS.steps, 16, 32, generator=generator),
    torch.randn(ARGS.batch * ARGS.steps, 1, generator=generator),
)


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Flatten(), nn.Linear(1024, 1)
    )


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x), y)  # a mean over the micro-batch's samples


def main() -> nn.Module:
    Path(ARGS.out).mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if ARGS.reference:
        accelerator = Accelerator(
            cpu=True, mixed_precision=ARGS.mixed_precision, gradient_accumulation_steps=ARGS.batch
        )
        model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(DATA, batch_size=1))
        for batch in loader:
            with accelerator.accumulate(model):
                accelerator.backward(loss_fn(model, batch))
                optimizer.step()
                optimizer.zero_grad()
    else:
        accelerator = Accelerator(cpu=True, mixed_precision=ARGS.mixed_precision)  # its accumulation stays 1
        model, optimizer, loader = accelerator.prepare(
            model, optimizer, DataLoader(DATA, batch_size=ARGS.batch)
        )
        guard = Guard(ARGS.micro, batch_size=ARGS.batch, sizes=[1, 2, ARGS.micro],
                      events=Path(ARGS.out) / "events.jsonl")  # fmt: skip
        with guard:
            for batch in loader:
                # guard.backward, not guard.step: accelerate's optimizer applies its own fp16 scaler when it steps
                loss = guard.backward(model, batch, loss_fn, scaler=accelerator.scaler)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                done = guard.last
                print(f"step {done.step}: {done.samples} samples, micro-batch {done.micro_batch_size}, "
                      f"attempts {done.attempts}, loss {float(loss):.4f}", flush=True)  # fmt: skip
        print(
            f"guard: {guard.summary.steps} batches, {guard.summary.out_of_memory} out of memory", flush=True
        )
    unwrapped = accelerator.unwrap_model(model)
    torch.save({k: v.detach() for k, v in unwrapped.state_dict().items()}, Path(ARGS.out) / "params.pt")
    return unwrapped


if __name__ == "__main__":
    main()
