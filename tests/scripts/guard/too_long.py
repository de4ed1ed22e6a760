"""A regression over samples that carry their cost in memory (a stand-in for their length), trained in a plain
loop under the guard with an events file. Batch ``--long-step`` holds a sample that costs more than the device
holds even alone: every micro-batch that holds it asks the allocator for a petabyte (a real out-of-memory
failure), down to one sample at a time, where the guard gives up with ``GuardError``.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import autobatch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--micro-batch", type=int, default=4)
parser.add_argument("--long-step", type=int, default=2)
parser.add_argument("--events", default="guard-events.jsonl")
args = parser.parse_args()

HOLDS = 10.0  # what a micro-batch's samples may cost together
generator = torch.Generator().manual_seed(0)
inputs = torch.randn(args.steps * args.batch_size, 6, generator=generator)
cost = torch.ones(args.steps * args.batch_size)
cost[args.long_step * args.batch_size] = 50.0  # one sample longer than the device holds


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    x, c = batch
    if float(c.sum()) > HOLDS:
        torch.empty(1 << 50, dtype=torch.uint8)  # the allocator refuses
    return F.mse_loss(model(x), x.sum(1, keepdim=True))


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
guard = autobatch.Guard(args.micro_batch, batch_size=args.batch_size, sizes=[1, 2], events=args.events)

with guard:
    for step in range(args.steps):
        rows = slice(step * args.batch_size, (step + 1) * args.batch_size)
        done = guard.step(model, optimizer, (inputs[rows], cost[rows]), loss_fn)
        print(f"step {done.step}: micro-batch {done.micro_batch_size}", flush=True)
