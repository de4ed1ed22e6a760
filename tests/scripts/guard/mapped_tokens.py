"""A classifier whose tokens come from a file mapped in memory, as nanoGPT reads its ``train.bin``: the
file is mapped whole, this run's tokens copied out and the mapping closed before training. Trained through
``autobatch.Guard``; prints the guard's summary as JSON.
"""

import argparse
import json
import mmap

import torch
from torch import nn

import autobatch

parser = argparse.ArgumentParser()
parser.add_argument("--tokens", default="train.bin", help="int16 token ids")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--length", type=int, default=32)
args = parser.parse_args()

VOCAB = 500
need = args.steps * args.batch_size * args.length
with open(args.tokens, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
    ids = torch.frombuffer(bytearray(mapped[: 2 * need]), dtype=torch.int16).long()
ids = ids.view(args.steps, args.batch_size, args.length) % VOCAB
labels = ids[:, :, 0] % 4

torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(VOCAB, 32), nn.Flatten(), nn.Linear(32 * args.length, 4))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


def compute_loss(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


with autobatch.Guard(4, batch_size=args.batch_size) as guard:
    for step in range(args.steps):
        guard.step(model, optimizer, (ids[step], labels[step]), compute_loss)
print(json.dumps(guard.close().to_dict()))
