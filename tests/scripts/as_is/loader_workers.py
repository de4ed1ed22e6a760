"""A plain loop as people write it: the data set prepared at import, a shuffled DataLoader with two worker
processes, every batch of one shape. The workers are forked (Linux's default); with ``--spawn`` they are
started as ``multiprocessing_context="spawn"`` starts them: each a fresh interpreter that imports this script
again (as ``__mp_main__``, hence the ``__main__`` guard) and gets the data set through shared memory. Either
way each batch reaches the training process as shared memory the worker filled.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SAMPLES, FEATURES, WIDTH, CLASSES = 32_768, 256, 1024, 10

torch.manual_seed(0)
features = torch.randn(SAMPLES, FEATURES)
labels = features[:, :CLASSES].argmax(1)  # a class the model can learn
dataset = TensorDataset(features, labels)


def main() -> None:
    parser = argparse.ArgumentParser(description="a classifier fed by DataLoader workers")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--spawn", action="store_true", help="spawn the workers instead of forking them")
    args = parser.parse_args()

    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=2,
        multiprocessing_context="spawn" if args.spawn else None,
    )
    model = nn.Sequential(nn.Linear(FEATURES, WIDTH), nn.ReLU(), nn.Dropout(0.1), nn.Linear(WIDTH, CLASSES))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
