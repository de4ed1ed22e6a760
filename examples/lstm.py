"""An LSTM language model on random tokens: a recurrent example for autobatch.

Embedding, a stack of ``nn.LSTM`` layers and a linear head over the vocabulary, trained with
next-token cross-entropy. On the CPU, PyTorch runs ``nn.LSTM`` in training through oneDNN
(``mkldnn_rnn_layer``), which keeps per-layer workspaces for backward that the step's Python code never
sees. Script arguments go after ``--``::

    autobatch tune examples/lstm.py --device cpu --memory 1GiB -- --hidden 512 --layers 2

Running this file directly (``python examples/lstm.py``) trains a few steps, which autobatch never does.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch import nn


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Read this script's own arguments; arguments it does not know are left to whoever owns them."""
    parser = argparse.ArgumentParser(
        description="LSTM language model example for autobatch", allow_abbrev=False
    )
    parser.add_argument("--vocab", type=int, default=4096, help="vocabulary size")
    parser.add_argument("--embed", type=int, default=128, help="embedding features")
    parser.add_argument("--hidden", type=int, default=256, help="LSTM hidden features")
    parser.add_argument("--layers", type=int, default=2, help="stacked LSTM layers")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sample")
    args, _unknown = parser.parse_known_args(argv)
    return args


ARGS = parse_args(sys.argv[1:])


class LSTMLanguageModel(nn.Module):
    def __init__(self, vocab: int, embed: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _state = self.lstm(self.embed(tokens))
        return self.head(out)


def build_model() -> nn.Module:
    return LSTMLanguageModel(ARGS.vocab, ARGS.embed, ARGS.hidden, ARGS.layers)


def make_batch(batch_size: int) -> torch.Tensor:
    """Random token ids of the full sequence length (the worst case); a fixed seed keeps probes comparable."""
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, ARGS.vocab, (batch_size, ARGS.seq_len + 1), generator=generator)


def compute_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))


if __name__ == "__main__":
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = make_batch(8)
    for step in range(3):
        loss = compute_loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: loss {loss.item():.4f}")
