"""A model trained on two data sets at once: each optimizer step takes a batch of each (prose and code), runs
each through the guard's ``backward`` and then steps once, as multi-task and data-mixing loops do. Without
``--guard`` each batch runs whole. Writes the parameters to ``--out``. ``AUTOBATCH_GUARD_FAIL_AT`` lowers the
guard: guard batch 1 is the code batch of the first step.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--guard", action="store_true")
parser.add_argument("--out", default="params.pt")
args = parser.parse_args()

torch.set_default_dtype(torch.float64)
generator = torch.Generator().manual_seed(0)
prose = torch.randn(args.steps * args.batch_size, 8, generator=generator)
code = torch.randn(args.steps * args.batch_size, 8, generator=generator)


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.mse_loss(model(x), y)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
guard = None
if args.guard:
    import autobatch

    guard = autobatch.Guard(args.batch_size, sizes=[4, 8])

for step in range(args.steps):
    rows = slice(step * args.batch_size, (step + 1) * args.batch_size)
    for x, y in (
        (prose[rows], prose[rows].sum(1, keepdim=True)),
        (code[rows], code[rows].prod(1, keepdim=True)),
    ):
        if guard is not None:
            guard.backward(model, (x, y), loss_fn)
        else:
            loss_fn(model, (x, y)).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
torch.save(model.state_dict(), args.out)
