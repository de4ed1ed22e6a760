"""Supervised fine-tuning as people write it: prompt tokens masked with -100, a loss that is the mean over the
answer's tokens (written by hand), and a loader that sorts samples by length, so that the last samples of a batch
are the ones whose answer was truncated away: every label -100.

``--guard`` runs each batch through ``autobatch.Guard`` with ``weight=`` the micro-batch's answer tokens (as
docs/guard.md says for a token-mean loss); without it the whole batch runs at once. Writes the parameters to
``--out`` and each step's loss, one a line, to ``--losses``. ``AUTOBATCH_GUARD_FAIL_AT`` lowers the guard.
"""

import argparse
import json

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--micro-batch", type=int, default=8)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--guard", action="store_true")
parser.add_argument("--out", default="params.pt")
parser.add_argument("--losses", default="losses.jsonl")
args = parser.parse_args()

torch.set_default_dtype(torch.float64)
VOCAB, PROMPT, LENGTH = 64, 6, 16
generator = torch.Generator().manual_seed(0)


def example(index: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, VOCAB, (LENGTH,), generator=generator)
    labels = ids.clone()
    labels[:PROMPT] = -100
    if index % args.batch_size >= args.batch_size - 2:  # the answer was truncated away
        labels[:] = -100
    return {"input_ids": ids, "labels": labels}


data = [example(i) for i in range(args.steps * args.batch_size)]
loader = DataLoader(data, batch_size=args.batch_size, shuffle=False)


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.body = nn.Sequential(nn.Linear(32, 32), nn.Tanh())
        self.head = nn.Linear(32, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(ids)))


def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(batch["input_ids"])[:, :-1]
    labels = batch["labels"][:, 1:]
    mask = labels != -100
    nll = F.cross_entropy(logits.flatten(0, 1), labels.flatten().clamp(min=0), reduction="none")
    return (nll * mask.flatten()).sum() / mask.sum()  # the mean over the answer's tokens


def answer_tokens(batch: dict[str, torch.Tensor]) -> int:
    return int((batch["labels"][:, 1:] != -100).sum())


torch.manual_seed(0)
model = TinyLM()
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)

if __name__ == "__main__":
    guard = None
    if args.guard:
        import autobatch

        guard = autobatch.Guard(args.micro_batch, batch_size=args.batch_size, sizes=[1, 2])
    with open(args.losses, "w") as log:
        for batch in loader:
            if guard is not None:
                loss = guard.step(model, optimizer, batch, loss_fn, weight=answer_tokens).loss
            else:
                step_loss = loss_fn(model, batch)
                step_loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                loss = float(step_loss.detach())
            log.write(json.dumps({"loss": loss}) + "\n")
    torch.save(model.state_dict(), args.out)
