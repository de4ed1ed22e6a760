"""A token classifier trained in a plain loop under ``autobatch.Guard``, for ``autobatch run`` (``--batch-size
{batch} --grad-accum {accum}``): the loader's batch is micro-batch x accumulation, and the guard splits it.
Batch ``--long-step`` holds one document far longer than the rest (``--long-length`` tokens), whose
activations do not fit under the job's cap even one sample at a time.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import autobatch

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--grad-accum", type=int, default=1)
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--long-step", type=int, default=3)
parser.add_argument("--long-length", type=int, default=1_500_000)
parser.add_argument("--resume", action="store_true")
args = parser.parse_args()

VOCAB, WIDTH = 1000, 64
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 2))
optimizer = torch.optim.AdamW(model.parameters())
batch = args.batch_size * args.grad_accum
guard = autobatch.Guard(args.batch_size, batch_size=batch)


def loss_fn(model: nn.Module, micro: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    ids, labels = micro
    return F.cross_entropy(model(ids).flatten(0, 1), labels.flatten())


with guard:
    for step in range(args.steps):
        length = args.long_length if step == args.long_step else 64
        ids = torch.randint(0, VOCAB, (batch, length))
        guard.step(model, optimizer, (ids, ids % 2), loss_fn)
        print(f"step {step}", flush=True)
