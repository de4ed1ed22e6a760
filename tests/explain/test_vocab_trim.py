"""The vocabulary-trim lever's model change: only the output head follows the embedding."""

from __future__ import annotations

import torch
from torch import nn

from autobatch.explain.worker.transforms import trim_vocabulary


class Decoder(nn.Module):
    """A block whose MLP widens to 4 x 64 = 256, as many outputs as the vocabulary has words."""

    def __init__(self, vocab: int = 256, width: int = 64, tied: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.head = nn.Linear(width, vocab, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        return self.head(x + self.mlp(x))


def test_a_hidden_layer_as_wide_as_the_vocabulary_is_left_alone() -> None:
    model = Decoder()
    assert trim_vocabulary(model, 0.5) == (256, 128)
    assert model.mlp[0].out_features == 256 and model.mlp[0].weight.shape == (256, 64)
    assert model.head.out_features == 128 and model.head.weight.shape == (128, 64)
    logits = model(torch.randint(0, 128, (2, 5)))
    assert logits.shape == (2, 5, 128)


def test_a_tied_head_follows_the_embedding() -> None:
    model = Decoder(tied=True)
    trim_vocabulary(model, 0.5)
    assert model.head.weight is model.embed.weight
    assert model.head.weight.shape == (128, 64) and model.mlp[0].weight.shape == (256, 64)
    assert model(torch.randint(0, 128, (2, 5))).shape == (2, 5, 128)
