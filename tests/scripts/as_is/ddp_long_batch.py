"""A torchrun-style training script as people write them: argparse, DDP on gloo when torchrun started it
(RANK, WORLD_SIZE), data prepared at import, gradient accumulation, a checkpoint in the working folder and
--resume. One batch (--long-step, on rank --long-rank only) holds --long-factor times longer samples: a plan
tuned on the typical batches runs out of memory there, on that rank alone, and holds at half its micro-batch.

Rank 0 writes ``checkpoint.pt`` after each optimizer step and appends ``step N micro M accum A world W
resumed R`` to ``steps.log``.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, required=True)
parser.add_argument("--grad-accum", type=int, default=1)
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--long-step", type=int, default=3, help="-1: no long batch")
parser.add_argument("--long-rank", type=int, default=1)
parser.add_argument("--long-factor", type=int, default=64)
parser.add_argument("--resume", action="store_true")
args = parser.parse_args()

WIDTH, HIDDEN, LENGTH, CLASSES = 64, 2048, 16, 10
world = int(os.environ.get("WORLD_SIZE", "1"))
rank = int(os.environ.get("RANK", "0"))
if world > 1:
    dist.init_process_group("gloo")
torch.manual_seed(0)
LONG = [step == args.long_step and rank == args.long_rank for step in range(args.steps)]

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
if world > 1:
    model = DistributedDataParallel(model)

for step in range(start, args.steps):
    optimizer.zero_grad(set_to_none=True)
    length = LENGTH * (args.long_factor if LONG[step] else 1)
    for _ in range(args.grad_accum):
        x = torch.randn(args.batch_size, length, WIDTH)
        y = torch.randint(0, CLASSES, (args.batch_size,))
        loss = F.cross_entropy(model(x).mean(dim=1), y) / args.grad_accum
        loss.backward()
    optimizer.step()
    if rank == 0:
        inner = model.module if world > 1 else model
        torch.save(
            {"model": inner.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1},
            "checkpoint.pt",
        )
        with open("steps.log", "a") as log:
            log.write(
                f"step {step} micro {args.batch_size} accum {args.grad_accum} world {world} resumed {int(args.resume)}\n"
            )
if world > 1:
    dist.destroy_process_group()
if rank == 0:
    print("done")
