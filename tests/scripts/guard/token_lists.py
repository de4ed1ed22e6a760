"""A bag-of-tokens classifier over token sequences of their own lengths, as a ``Dataset`` of dicts returns them:
a collate function keeps each sample's tokens as a tensor of its own length (a list, one a sample) and stacks
the labels. Trained with SGD in its own loop.

``--guard`` runs each batch through ``autobatch.Guard``; without it the whole batch runs at once. Prints one line a
batch; writes the parameters to ``--out``. ``AUTOBATCH_GUARD_FAIL_AT`` lowers the guard. ``--flat-labels``: the
collate gives one label a token, flattened over the batch (a token-level loss), beside ``lengths``. ``--bare``: the
collate returns the samples' token tensors alone, as a list (each sample's label is its first token's class).
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--micro-batch", type=int, default=16)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--guard", action="store_true")
parser.add_argument("--flat-labels", action="store_true")
parser.add_argument("--bare", action="store_true")
parser.add_argument("--out", default="params.pt")
args = parser.parse_args()

torch.set_default_dtype(torch.float64)
VOCAB, CLASSES = 300, 3


class Sequences(Dataset):
    def __len__(self) -> int:
        return args.steps * args.batch_size

    def __getitem__(self, index: int) -> dict:
        generator = torch.Generator().manual_seed(index)
        length = 40 if index % args.batch_size == 0 else int(torch.randint(2, 30, (), generator=generator))
        tokens = torch.randint(0, VOCAB, (length,), generator=generator)
        return {"tokens": tokens, "label": int(tokens[0]) % CLASSES}


def collate(samples: list[dict]) -> dict | list[torch.Tensor]:
    tokens = [s["tokens"] for s in samples]
    if args.bare:
        return tokens
    if args.flat_labels:
        labels = torch.cat([torch.full((len(t),), s["label"]) for t, s in zip(tokens, samples)])
        return {"tokens": tokens, "labels": labels}
    return {"tokens": tokens, "label": torch.tensor([s["label"] for s in samples])}


class BagOfTokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(VOCAB, 16, mode="mean")
        self.head = nn.Linear(16, CLASSES)

    def forward(self, tokens: list[torch.Tensor]) -> torch.Tensor:
        offsets = torch.tensor([0] + [len(t) for t in tokens[:-1]]).cumsum(0)
        return self.head(self.embed(torch.cat(tokens), offsets))


def loss_fn(model: nn.Module, batch: dict | list[torch.Tensor]) -> torch.Tensor:
    if isinstance(batch, list):
        return F.cross_entropy(model(batch), torch.stack([t[0] % CLASSES for t in batch]))
    logits = model(batch["tokens"])
    if args.flat_labels:  # each sample's logits for each of its tokens
        lengths = torch.tensor([len(t) for t in batch["tokens"]])
        return F.cross_entropy(logits.repeat_interleave(lengths, 0), batch["labels"])
    return F.cross_entropy(logits, batch["label"])


torch.manual_seed(0)
model = BagOfTokens()
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
loader = DataLoader(Sequences(), batch_size=args.batch_size, shuffle=False, collate_fn=collate)

if __name__ == "__main__":
    guard = None
    if args.guard:
        import autobatch

        guard = autobatch.Guard(args.micro_batch, batch_size=args.batch_size, sizes=[4, 8])
    for batch in loader:
        if guard is not None:
            done = guard.step(model, optimizer, batch, loss_fn)
            print(
                f"step {done.step}: {done.samples} samples, micro-batch {done.micro_batch_size} x {done.micro_batches}"
            )
        else:
            loss_fn(model, batch).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    torch.save(model.state_dict(), args.out)
