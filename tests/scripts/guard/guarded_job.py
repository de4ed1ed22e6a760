"""A small language-model script in autobatch's three functions, with its own training loop under
``__main__`` run through ``autobatch.Guard.from_result``: tuned with ``autobatch tune``, then trained with the
tuned plan. ``--fail-step K --fail-above N`` is a test hook: at batch K a micro-batch of more than N samples
asks the allocator for a petabyte, a real out-of-memory failure (``DefaultCPUAllocator``).
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

VOCAB, WIDTH, TOKENS = 512, 64, 32


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.body = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU())
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(ids)))


def build_model() -> nn.Module:
    return Net()


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (batch_size, TOKENS), generator=generator)
    return ids, torch.randint(0, VOCAB, (batch_size, TOKENS), generator=generator)


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    ids, targets = batch
    return F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())


if __name__ == "__main__":
    import autobatch

    parser = argparse.ArgumentParser()
    parser.add_argument("--result", default="autobatch-result.json")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--fail-step", type=int, default=-1)
    parser.add_argument("--fail-above", type=int, default=0)
    parser.add_argument("--raise-at", type=int, default=-1, help="raise a ValueError at this batch")
    args = parser.parse_args()

    guard = autobatch.Guard.from_result(args.result, events="guard-events.jsonl")
    ids, targets = make_batch(guard.batch_size * args.steps)
    loader = DataLoader(TensorDataset(ids, targets), batch_size=guard.batch_size)
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if step == args.fail_step and len(batch[0]) > args.fail_above:
            torch.empty(1 << 50, dtype=torch.uint8)  # the test hook: the allocator refuses
        if step == args.raise_at:
            raise ValueError(f"label out of range at batch {step}")
        return compute_loss(model, batch)

    with guard:
        for step, batch in enumerate(loader):
            done = guard.step(model, optimizer, batch, loss_fn)
            print(f"step {done.step} samples {done.samples} micro-batch {done.micro_batch_size}", flush=True)
    print("done")
