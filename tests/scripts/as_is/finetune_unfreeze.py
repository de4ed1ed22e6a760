"""Fine-tuning with a frozen backbone that is unfrozen after a number of steps, as transfer-learning recipes do.

The head trains alone first (the optimizer holds only the parameters that require gradients); after
``--unfreeze-after`` steps the backbone's parameters join the optimizer with a smaller learning rate. From
then on the backward pass runs through the backbone: its activations, gradients and Adam state are new memory.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description="fine-tune a classifier, unfreezing its backbone later")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=100)
parser.add_argument(
    "--unfreeze-after", type=int, default=20, help="optimizer steps before the backbone trains"
)
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()

torch.manual_seed(0)
TOKENS, VOCAB, WIDTH, CLASSES, LAYERS = 512, 1000, 32, 10, 6
tokens = torch.randint(0, VOCAB, (2048, TOKENS), dtype=torch.int32)  # 4 MiB
labels = torch.randint(0, CLASSES, (2048,))
loader = DataLoader(TensorDataset(tokens, labels), batch_size=args.batch_size, shuffle=True, drop_last=True)

backbone = nn.Sequential(
    nn.Embedding(VOCAB, WIDTH),
    *[layer for _ in range(LAYERS) for layer in (nn.Linear(WIDTH, WIDTH), nn.GELU())],
)
head = nn.Linear(WIDTH, CLASSES)
model = nn.ModuleDict({"backbone": backbone, "head": head})
for p in backbone.parameters():  # the pretrained backbone stays fixed at first
    p.requires_grad = False
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)

step = 0
for epoch in range(args.epochs):
    for x, y in loader:
        if step == args.unfreeze_after:
            for p in backbone.parameters():
                p.requires_grad = True
            optimizer.add_param_group({"params": list(backbone.parameters()), "lr": args.lr / 10})
            print(f"step {step}: backbone unfrozen")
        logits = head(backbone(x).mean(dim=1))
        loss = F.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
    print(f"epoch {epoch} loss {loss.item():.3f}")
