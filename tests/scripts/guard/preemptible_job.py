"""A long guarded job as a cluster runs it, until the scheduler preempts it (SIGTERM): the guard knows the tuned
key of its plan (``--key``, as ``Guard.from_result`` finds it in a result kept in the cache), so its run is
runtime evidence, and writes its events to ``--events``. Prints ``step N`` after each batch.
``AUTOBATCH_GUARD_FAIL_AT`` lowers the guard.
"""

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

import autobatch
from autobatch.guard import Evidence

parser = argparse.ArgumentParser()
parser.add_argument("--key", default=None)
parser.add_argument("--events", default=None)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--micro-batch", type=int, default=8)
args = parser.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.AdamW(model.parameters())
guard = autobatch.Guard(
    args.micro_batch,
    batch_size=args.batch_size,
    sizes=[2, 4],
    events=args.events,
    evidence=Evidence(args.key) if args.key else None,
)


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.mse_loss(model(x), y)


with guard:
    step = 0
    while True:  # until preempted
        x = torch.randn(args.batch_size, 32)
        guard.step(model, optimizer, (x, x.sum(1, keepdim=True)), loss_fn)
        print(f"step {step}", flush=True)
        step += 1
        time.sleep(0.02)
