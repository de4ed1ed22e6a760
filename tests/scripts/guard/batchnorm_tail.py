"""A classifier with BatchNorm1d trained in a plain loop under the guard, over a data set that does not divide
into whole batches: the DataLoader's last batch is short (100 samples in batches of 12: a last batch of 4).

``AUTOBATCH_GUARD_FAIL_AT`` lowers the guard (from ``--micro-batch`` one rung down ``--sizes``). Prints one line
a batch: its step, samples, micro-batch and number of micro-batches.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import autobatch

parser = argparse.ArgumentParser()
parser.add_argument("--samples", type=int, default=100)
parser.add_argument("--batch-size", type=int, default=12)
parser.add_argument("--micro-batch", type=int, default=6)
parser.add_argument("--sizes", default="3,6", help="the tuned sizes that fitted, comma-separated")
args = parser.parse_args()

generator = torch.Generator().manual_seed(0)
data = TensorDataset(
    torch.randn(args.samples, 16, generator=generator),
    torch.randint(0, 4, (args.samples,), generator=generator),
)
loader = DataLoader(data, batch_size=args.batch_size, shuffle=False)

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
guard = autobatch.Guard(
    args.micro_batch, batch_size=args.batch_size, sizes=[int(s) for s in args.sizes.split(",")]
)


def loss_fn(model: nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


with guard:
    for batch in loader:
        done = guard.step(model, optimizer, batch, loss_fn)
        print(
            f"step {done.step}: {done.samples} samples, micro-batch {done.micro_batch_size} x {done.micro_batches}"
        )
