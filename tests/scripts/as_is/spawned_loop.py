"""Training in a process of its own: ``torch.multiprocessing.spawn`` with one process, as scripts written for
several GPUs start it on one (its real AdamW steps in the child, which a probe of the script cannot see)."""

import argparse

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn


def train(rank: int, batch_size: int, steps: int) -> None:
    torch.manual_seed(rank)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(steps):
        inputs, labels = torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,))
        loss = F.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 1000 == 0:
            print(f"rank {rank} step {step} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="a classifier trained in a spawned process")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10_000_000)
    args = parser.parse_args()
    mp.spawn(train, args=(args.batch_size, args.steps), nprocs=1)
