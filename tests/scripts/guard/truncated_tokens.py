"""A bag-of-tokens classifier over documents truncated to ``--max-length`` tokens, as a ``Dataset`` of dicts returns
them: a collate keeps each document's tokens as a tensor of its own length (a list, one a sample; no padding, as
``EmbeddingBag`` takes them concatenated) and stacks the labels. The documents are 8 to 200 tokens long, so at
``--max-length 16`` nearly all of them are cut to 16 tokens: a batch of 16 whose documents all reach the maximum is
a list of 16 tensors of 16 tokens each, as many tokens as the batch has samples. Trained with SGD in its own loop.

``--guard`` runs each batch through ``autobatch.Guard``; without it the whole batch runs at once. Prints one line a
batch (with how many of its documents were cut); writes the parameters to ``--out``. ``AUTOBATCH_GUARD_FAIL_AT``
lowers the guard.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--micro-batch", type=int, default=16)
parser.add_argument("--max-length", type=int, default=16)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--guard", action="store_true")
parser.add_argument("--out", default="params.pt")
args = parser.parse_args()

torch.set_default_dtype(torch.float64)
VOCAB, CLASSES = 300, 3


class Documents(Dataset):
    def __len__(self) -> int:
        return args.steps * args.batch_size

    def __getitem__(self, index: int) -> dict:
        generator = torch.Generator().manual_seed(index)
        length = int(torch.randint(8, 200, (), generator=generator))
        tokens = torch.randint(0, VOCAB, (length,), generator=generator)
        return {"tokens": tokens[: args.max_length], "label": int(tokens[0]) % CLASSES}


def collate(samples: list[dict]) -> dict:
    return {"tokens": [s["tokens"] for s in samples], "label": torch.tensor([s["label"] for s in samples])}


class BagOfTokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(VOCAB, 16, mode="mean")
        self.head = nn.Linear(16, CLASSES)

    def forward(self, tokens: list[torch.Tensor]) -> torch.Tensor:
        offsets = torch.tensor([0] + [len(t) for t in tokens[:-1]]).cumsum(0)
        return self.head(self.embed(torch.cat(tokens), offsets))


def loss_fn(model: nn.Module, batch: dict) -> torch.Tensor:
    return F.cross_entropy(model(batch["tokens"]), batch["label"])


torch.manual_seed(0)
model = BagOfTokens()
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
loader = DataLoader(Documents(), batch_size=args.batch_size, shuffle=False, collate_fn=collate)

guard = None
if args.guard:
    import autobatch

    guard = autobatch.Guard(args.micro_batch, batch_size=args.batch_size, sizes=[4, 8])
for step, batch in enumerate(loader):
    cut = sum(len(t) == args.max_length for t in batch["tokens"])
    if guard is not None:
        done = guard.step(model, optimizer, batch, loss_fn)
        print(
            f"step {step}: {done.samples} samples, {cut} cut, micro-batch {done.micro_batch_size} x {done.micro_batches}"
        )
    else:
        loss_fn(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
torch.save(model.state_dict(), args.out)
