"""A training script run as it is that starts a helper process of its own (a log shipper, here a sleeping
child) and trains until it is stopped; it writes ``pids.txt`` in the working folder (its pid and the
helper's) once both run. A scheduler's SIGTERM to ``autobatch run`` must end both."""

import argparse
import os
import subprocess
import sys
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, required=True)
parser.add_argument("--grad-accum", type=int, default=1)
args = parser.parse_args()

helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
model = nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
with open("pids.txt.tmp", "w") as handle:
    handle.write(f"{os.getpid()} {helper.pid}\n")
os.replace("pids.txt.tmp", "pids.txt")
while True:
    model(torch.randn(args.batch_size, 8)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    time.sleep(0.05)
