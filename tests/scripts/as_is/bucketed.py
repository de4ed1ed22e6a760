"""A language-model loop over length buckets, shortest first: its first batches are short, its later ones long.

The peak of a step rises when the long bucket starts, after the optimizer state exists.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader

VOCAB, WIDTH = 256, 64
BUCKETS = (32, 32, 256)  # tokens per sequence of each bucket, in the order the loader visits them

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
args = parser.parse_args()


def bucket(length: int) -> list[torch.Tensor]:
    return [torch.randint(0, VOCAB, (length,)) for _ in range(args.batch_size)]


sequences = [seq for length in BUCKETS for seq in bucket(length)]
loader = DataLoader(sequences, batch_size=args.batch_size, shuffle=False)
model = nn.Sequential(
    nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, VOCAB)
)
optimizer = torch.optim.AdamW(model.parameters())
for epoch in range(10):
    for ids in loader:
        logits = model(ids[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
