"""A DistributedDataParallel script as people write it for ``torchrun``: it joins the process group itself.

It reads its rank from the environment ``torchrun`` gives, calls ``init_process_group`` (``gloo`` on the CPU,
``nccl`` on GPUs), wraps its model in DDP and shards its data with a ``DistributedSampler``. The job runs it
with ``torchrun --nproc-per-node 2 examples/as_is/ddp_torchrun.py --batch-size 64``; autobatch tunes it as
it is, every rank measured, ``{batch}`` the per-rank micro-batch::

    autobatch tune examples/as_is/ddp_torchrun.py --device cpu --memory 1GiB --nproc-per-node 2 \\
        -- --batch-size {batch}

The model reads 512 tokens per sample and runs eight narrow Linear + GELU blocks (64 features) on each: about
2.5 MiB of activations per sample for little arithmetic, so each rank's maximum under 1 GiB is a few hundred
samples and a step stays quick on one thread per rank (torchrun's default on the CPU).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class MeanPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)


def main() -> None:
    parser = argparse.ArgumentParser(description="DDP training, launched by torchrun")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--samples", type=int, default=2048)
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")

    torch.manual_seed(0)
    tokens_per_sample, vocab, width, classes = 512, 1000, 64, 10
    tokens = torch.randint(0, vocab, (args.samples, tokens_per_sample), dtype=torch.int32)
    labels = torch.randint(0, classes, (args.samples,))
    data = TensorDataset(tokens, labels)
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)

    model = nn.Sequential(
        nn.Embedding(vocab, width),
        *[layer for _ in range(8) for layer in (nn.Linear(width, width), nn.GELU())],
        MeanPool(),
        nn.Linear(width, classes),
    ).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(loader):
            loss = F.cross_entropy(ddp(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 20 == 0 and dist.get_rank() == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
