"""Trains a small causal decoder whose settings live in a YAML config (--config), as most training scripts keep
them; the launcher or a sweep overrides a few from the environment (SEQ_LEN, BATCH_SIZE), and nothing in the
command line carries the sequence length. Eager attention keeps its (batch, heads, L, L) scores for backward."""

import argparse
import os

import torch
import torch.nn.functional as F
import yaml
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--config", required=True)
args = parser.parse_args()

with open(args.config) as handle:
    config = yaml.safe_load(handle)
config["seq_len"] = int(os.environ.get("SEQ_LEN", config["seq_len"]))
config["batch_size"] = int(os.environ.get("BATCH_SIZE", config["batch_size"]))
print(f"training at {config['seq_len']} tokens, batch {config['batch_size']}", flush=True)

VOCAB, WIDTH, HEADS = config["vocab"], config["width"], config["heads"]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.out = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, length, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) / (q.shape[-1] ** 0.5)
        mask = torch.ones(length, length, dtype=torch.bool).triu(1)
        attention = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.out(attention.transpose(1, 2).reshape(batch, length, WIDTH))
        return x + self.mlp(self.norm2(x))


model = nn.Sequential(
    nn.Embedding(VOCAB, WIDTH), *[Block() for _ in range(config["depth"])], nn.Linear(WIDTH, VOCAB)
)
optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
for step in range(config["steps"]):
    tokens = torch.randint(0, VOCAB, (config["batch_size"], config["seq_len"] + 1))
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
