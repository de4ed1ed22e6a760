"""A plain loop whose every batch comes from a slow source (``STEP_SECONDS`` each, default 0.3: a job reading
from a network file system), as people write one. It also keeps a witness: while it lives it holds an exclusive
lock on the file ``OVERLAP_LOCK`` names, and one that finds the lock taken (another run of it alive beside it,
on the same device) appends a line to ``OVERLAP_LOG``."""

import argparse
import fcntl
import os
import time

witness = os.environ.get("OVERLAP_LOCK")
if witness:
    held = open(witness, "a")  # noqa: SIM115  # held for the process's life
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        with open(os.environ["OVERLAP_LOG"], "a") as log:
            log.write(f"pid {os.getpid()} started at {time.time():.3f} beside another run\n")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--steps", type=int, default=1000)
args = parser.parse_args()

model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(args.steps):
    time.sleep(float(os.environ.get("STEP_SECONDS", "0.3")))  # the next batch, from the slow source
    x, y = torch.randn(args.batch_size, 256), torch.randint(0, 10, (args.batch_size,))
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
