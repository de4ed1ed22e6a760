"""A training script as people write them: argparse, data prepared at import, a checkpoint in the working
folder, gradient accumulation and --resume. Its data holds one long batch, at step --long-step, whose
activations are --long-factor times a typical batch's: a plan tuned on the typical batches runs out of
memory there at its micro-batch, and holds at half of it.

Each optimizer step writes ``checkpoint.pt`` (the model, the optimizer and the step) and appends a line to
``steps.log``: ``step N micro M accum A resumed R``; ``--resume`` starts from the checkpoint.
"""

import argparse
import os

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, required=True)
parser.add_argument("--grad-accum", type=int, default=1)
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--long-step", type=int, default=3)
parser.add_argument("--long-factor", type=int, default=64)
parser.add_argument("--global-batch", type=int, default=8)
parser.add_argument("--resume", action="store_true")
args = parser.parse_args()

WIDTH, HIDDEN, LENGTH, CLASSES = 64, 2048, 16, 10
torch.manual_seed(0)
# The data set, prepared at import: one length per optimizer step, the long one at --long-step.
LENGTHS = [LENGTH * (args.long_factor if step == args.long_step else 1) for step in range(args.steps)]

model = nn.Sequential(
    nn.Linear(WIDTH, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, CLASSES)
)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
start = 0
if args.resume and os.path.exists("checkpoint.pt"):
    state = torch.load("checkpoint.pt")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["step"]

assert args.batch_size * args.grad_accum == args.global_batch, "the global batch changed"
for step in range(start, args.steps):
    optimizer.zero_grad(set_to_none=True)
    for _ in range(args.grad_accum):
        x = torch.randn(args.batch_size, LENGTHS[step], WIDTH)
        y = torch.randint(0, CLASSES, (args.batch_size,))
        loss = F.cross_entropy(model(x).mean(dim=1), y) / args.grad_accum
        loss.backward()
    optimizer.step()
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1}, "checkpoint.pt"
    )
    with open("steps.log", "a") as log:
        log.write(f"step {step} micro {args.batch_size} accum {args.grad_accum} resumed {int(args.resume)}\n")
print("done")
