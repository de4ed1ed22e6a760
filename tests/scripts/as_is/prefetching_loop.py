"""A plain loop that starts helper processes before training, as data pipelines and loggers do: a
``multiprocessing`` daemon process that prefetches batches into a queue, a log shipper in a session of its own
(``start_new_session=True``) that inherits stdout, and a watchdog left behind by a shell (``sh -c 'cmd &'``: a
double fork). Each helper's pid goes to ``--pid-file``; ``--no-helpers`` runs the same loop without them, on the
same batches made in the loop; ``--step-seconds`` slows every step (a tune to interrupt).
"""

import argparse
import multiprocessing
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, required=True)
parser.add_argument("--steps", type=int, default=1000)
parser.add_argument("--pid-file", default="helpers.pid")
parser.add_argument("--no-helpers", action="store_true")
parser.add_argument("--step-seconds", type=float, default=0.0)
args = parser.parse_args()

TOKENS, VOCAB, WIDTH, CLASSES = 128, 1000, 128, 10
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def prefetch(queue):
    """Keep a few batches of indices ready (the job's loader would read them from disk)."""
    generator = torch.Generator().manual_seed(0)
    while True:
        queue.put(torch.randint(0, VOCAB, (64, TOKENS), generator=generator))
        time.sleep(0.5)


def start_helpers():
    queue = multiprocessing.Queue(maxsize=4)
    prefetcher = multiprocessing.Process(target=prefetch, args=(queue,), daemon=True)
    prefetcher.start()
    shipper = subprocess.Popen(SLEEPER, start_new_session=True)  # stdout inherited
    watchdog = subprocess.run(
        ["sh", "-c", f"{' '.join(SLEEPER[:2])} '{SLEEPER[2]}' >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    with open(args.pid_file, "a") as pids:
        pids.write(f"{prefetcher.pid} {shipper.pid} {watchdog.stdout.strip()}\n")


class MeanPool(nn.Module):
    def forward(self, x):
        return x.mean(dim=1)


if __name__ == "__main__":
    if not args.no_helpers:
        start_helpers()
    model = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Tanh(), MeanPool(), nn.Linear(WIDTH, CLASSES))
    optimizer = torch.optim.AdamW(model.parameters())
    for step in range(args.steps):
        x, y = (
            torch.randint(0, VOCAB, (args.batch_size, TOKENS)),
            torch.randint(0, CLASSES, (args.batch_size,)),
        )
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.step_seconds)
