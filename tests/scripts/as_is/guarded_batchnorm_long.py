"""A text classifier with a BatchNorm1d head trained in a plain loop under ``autobatch.Guard``, for ``autobatch
run`` (``--batch-size {batch} --grad-accum {accum}``): the loader's batch is micro-batch x accumulation, and the
guard splits it. Batch ``--long-step`` holds documents of ``--long-length`` tokens: two of them do not fit under
the job's cap, one does, and the guard, lowered to one sample at a time, meets BatchNorm's refusal of a batch
of one in training.
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
parser.add_argument("--long-length", type=int, default=300_000)
parser.add_argument("--resume", action="store_true")
args = parser.parse_args()

VOCAB, WIDTH, CHANNELS, HIDDEN, CLASSES = 1000, 32, 64, 32, 2


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.conv = nn.Conv1d(WIDTH, CHANNELS, kernel_size=3, padding=1)
        self.head = nn.Sequential(
            nn.Linear(CHANNELS, HIDDEN), nn.BatchNorm1d(HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES)
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        features = F.relu(self.conv(self.embed(ids).transpose(1, 2)))
        return self.head(features.mean(dim=2))


torch.manual_seed(0)
model = Classifier()
optimizer = torch.optim.AdamW(model.parameters())
batch = args.batch_size * args.grad_accum
guard = autobatch.Guard(args.batch_size, batch_size=batch)


def loss_fn(model: nn.Module, micro: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    ids, labels = micro
    return F.cross_entropy(model(ids), labels)


with guard:
    for step in range(args.steps):
        length = args.long_length if step == args.long_step else 64
        ids = torch.randint(0, VOCAB, (batch, length))
        guard.step(model, optimizer, (ids, ids[:, 0] % CLASSES), loss_fn)
        print(f"step {step}", flush=True)
