"""A plain loop whose model is stepped by two optimizers over its parameter groups, as recent recipes do: AdamW
for the weight matrices, SGD with momentum for the biases and the norm. With ``--guard`` each batch goes through
``guard.step(model, [adamw, sgd], ...)``; without it, the batch runs whole and each optimizer steps. Writes the
parameters to ``--out``. ``AUTOBATCH_GUARD_FAIL_AT`` lowers the guard.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--guard", action="store_true")
parser.add_argument("--out", default="params.pt")
args = parser.parse_args()

torch.set_default_dtype(torch.float64)
generator = torch.Generator().manual_seed(0)
inputs = torch.randn(args.steps * args.batch_size, 8, generator=generator)
targets = inputs.sum(1, keepdim=True).sin()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 1))
matrices = [p for p in model.parameters() if p.ndim == 2]
others = [p for p in model.parameters() if p.ndim != 2]
adamw = torch.optim.AdamW(matrices, lr=1e-2)
sgd = torch.optim.SGD(others, lr=0.1, momentum=0.9)


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.mse_loss(model(x), y)


guard = None
if args.guard:
    import autobatch

    guard = autobatch.Guard(args.batch_size, sizes=[4, 8, 16])

for step in range(args.steps):
    rows = slice(step * args.batch_size, (step + 1) * args.batch_size)
    batch = (inputs[rows], targets[rows])
    if guard is not None:
        done = guard.step(model, [adamw, sgd], batch, loss_fn)
        print(f"step {done.step}: micro-batch {done.micro_batch_size}")
    else:
        loss_fn(model, batch).backward()
        adamw.step()
        sgd.step()
        adamw.zero_grad(set_to_none=True)
        sgd.zero_grad(set_to_none=True)
torch.save(model.state_dict(), args.out)
