"""A plain loop that checkpoints every few steps and resumes from its checkpoint (``--resume``), as jobs on a
preemptible cluster do; ``--stop-after N`` ends it after batch N, as a preemption would. The checkpoint holds
the model, the optimizer, the step and the guard's state. Prints one JSON line per batch: the loop's step, the
guard's step, the micro-batch and the attempts. ``AUTOBATCH_GUARD_FAIL_AT`` lowers the guard.
"""

import argparse
import json
import os

import torch
import torch.nn.functional as F
from torch import nn

import autobatch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--micro-batch", type=int, default=16)
parser.add_argument("--save-every", type=int, default=3)
parser.add_argument("--stop-after", type=int, default=-1)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--checkpoint", default="checkpoint.pt")
args = parser.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
guard = autobatch.Guard(
    args.micro_batch,
    batch_size=args.batch_size,
    sizes=[4, 8],
    settings=autobatch.LadderSettings(grow_after=20),
)
start = 0
if args.resume and os.path.exists(args.checkpoint):
    state = torch.load(args.checkpoint)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    guard.load_state_dict(state["guard"])
    start = state["step"] + 1


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.mse_loss(model(x), y)


with guard:
    for step in range(start, args.steps):
        x = torch.randn(args.batch_size, 8, generator=torch.Generator().manual_seed(step))
        done = guard.step(model, optimizer, (x, x.sum(1, keepdim=True)), loss_fn)
        print(
            json.dumps(
                {
                    "step": step,
                    "guard_step": done.step,
                    "micro": done.micro_batch_size,
                    "attempts": done.attempts,
                }
            )
        )
        if step % args.save_every == args.save_every - 1:
            torch.save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                 "guard": guard.state_dict()},
                args.checkpoint,
            )  # fmt: skip
        if step == args.stop_after:
            break
