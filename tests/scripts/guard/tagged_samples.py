"""A regression whose samples carry their source's name, as a ``Dataset`` of dicts returns them: the default
collate makes the names a list of strings (one per sample) and each sample's file a list of paths; the loss
weights each sample by its source.

``--guard`` runs each batch through ``autobatch.Guard``; without it the whole batch runs at once. Writes the
parameters to ``--out``. ``AUTOBATCH_GUARD_FAIL_AT`` lowers the guard.
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
parser.add_argument("--out", default="params.pt")
args = parser.parse_args()

torch.set_default_dtype(torch.float64)
SOURCE_WEIGHT = {"web": 1.0, "books": 3.0, "code": 0.5}


class Tagged(Dataset):
    def __len__(self) -> int:
        return args.steps * args.batch_size

    def __getitem__(self, index: int) -> dict:
        generator = torch.Generator().manual_seed(index)
        x = torch.randn(8, generator=generator)
        source = ("web", "books", "code")[index % 3]
        return {
            "x": x,
            "y": x.sum(0, keepdim=True) * (1 + index % 3),
            "source": source,
            "file": f"{index}.txt",
        }


def loss_fn(model: nn.Module, batch: dict) -> torch.Tensor:
    weights = torch.tensor([SOURCE_WEIGHT[name] for name in batch["source"]])
    errors = F.mse_loss(model(batch["x"]), batch["y"], reduction="none").squeeze(1)
    return (weights * errors).mean()


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
loader = DataLoader(Tagged(), batch_size=args.batch_size, shuffle=False)

if __name__ == "__main__":
    guard = None
    if args.guard:
        import autobatch

        guard = autobatch.Guard(args.micro_batch, batch_size=args.batch_size, sizes=[2, 4, 8])
    for batch in loader:
        if guard is not None:
            done = guard.step(model, optimizer, batch, loss_fn)
            print(f"step {done.step}: micro-batch {done.micro_batch_size}")
        else:
            loss_fn(model, batch).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    torch.save(model.state_dict(), args.out)
