"""A torchrun-style DDP script whose rank 1 fails before its first step (rank 0 then waits in a collective)."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
args = parser.parse_args()

dist.init_process_group("gloo")
model = DistributedDataParallel(nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if int(os.environ["RANK"]) == 1:
    raise FileNotFoundError("rank 1 could not open its shard: ./data/shard-1")
for _ in range(100):
    loss = model(torch.randn(args.batch_size, 64)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
