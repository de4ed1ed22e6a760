"""A classifier with BatchNorm and Dropout trained in a plain loop under the guard, on samples that carry their
cost in memory (a stand-in for their length). A micro-batch whose samples cost more than the device holds asks
the allocator for a petabyte: a real out-of-memory failure, raised where a long sample's activations would be.

``--heavy-step K`` makes the last samples of batch K heavy, so that batch runs out in its second micro-batch,
after the first one drew its dropout masks and moved BatchNorm's running statistics; the guard lowers and runs
it again. Writes the parameters and buffers to ``--out``. ``AUTOBATCH_GUARD_FAIL_AT`` lowers the guard too.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import autobatch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--micro-batch", type=int, default=8)
parser.add_argument("--heavy-step", type=int, default=-1)
parser.add_argument("--out", default="params.pt")
args = parser.parse_args()

torch.set_default_dtype(torch.float64)
HOLDS = 10.0  # what a micro-batch's samples may cost together
generator = torch.Generator().manual_seed(0)
inputs = torch.randn(args.steps * args.batch_size, 12, generator=generator)
labels = torch.randint(0, 3, (args.steps * args.batch_size,), generator=generator)
cost = torch.ones(args.steps * args.batch_size)
if args.heavy_step >= 0:
    cost[(args.heavy_step + 1) * args.batch_size - 4 : (args.heavy_step + 1) * args.batch_size] = 2.0


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    x, y, c = batch
    if float(c.sum()) > HOLDS:
        torch.empty(1 << 50, dtype=torch.uint8)  # the allocator refuses
    return F.cross_entropy(model(x), y)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(12, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
guard = autobatch.Guard(args.micro_batch, sizes=[4], settings=autobatch.LadderSettings(grow_after=100))

if __name__ == "__main__":
    with guard:
        for step in range(args.steps):
            rows = slice(step * args.batch_size, (step + 1) * args.batch_size)
            guard.step(model, optimizer, (inputs[rows], labels[rows], cost[rows]), loss_fn)
    torch.save(model.state_dict(), args.out)
