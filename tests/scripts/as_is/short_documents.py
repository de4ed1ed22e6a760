"""Fine-tune a causal LM on tokenized documents (dicts of input_ids, as a Hugging Face data set gives them),
truncated to --max-length and padded to each batch's longest by the collator. Every document is shorter than
48 tokens, so a --max-length of 256 or 512 truncates nothing: the batches never reach it."""

import argparse
import random

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

parser = argparse.ArgumentParser()
parser.add_argument("--per-device-train-batch-size", type=int, default=8)
parser.add_argument("--max-length", type=int, default=512)
args = parser.parse_args()

VOCAB, WIDTH = 8192, 32
rng = random.Random(0)
documents = [
    {"input_ids": [rng.randrange(1, VOCAB) for _ in range(rng.randint(16, 47))]} for _ in range(4000)
]
train = [{"input_ids": doc["input_ids"][: args.max_length]} for doc in documents]


def collate(features: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), longest, dtype=torch.long)
    labels = torch.full((len(features), longest), -100)
    for i, f in enumerate(features):
        ids[i, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
        labels[i, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
    return {"input_ids": ids, "labels": labels}


model = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, VOCAB))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
loader = DataLoader(train, batch_size=args.per_device_train_batch_size, shuffle=True, collate_fn=collate)
for epoch in range(3):
    for batch in loader:
        logits = model(batch["input_ids"])
        loss = F.cross_entropy(
            logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=-100
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
