"""Activation recomputation: which blocks are found, and what wrapping them changes (only memory)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autobatch.step.recompute import count_blocks, detect_blocks, wrap_blocks

WIDTH, BATCH = 64, 256


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class Net(nn.Module):
    """A stem, four repeated blocks in a ModuleList, a head."""

    def __init__(self, depth: int = 4) -> None:
        super().__init__()
        self.stem = nn.Linear(16, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(depth))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_detects_the_repeated_block_class():
    assert detect_blocks(Net()) == ("Block",)
    assert detect_blocks(nn.Sequential(Block(), Block(), nn.ReLU())) == ("Block",)


@pytest.mark.parametrize(
    "model",
    [
        nn.Linear(4, 4),  # no container
        Net(depth=1),  # one block is not repeated
        nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.ReLU(), nn.ReLU()),  # repeated, but no parameters
    ],
    ids=["no-container", "single-block", "parameterless"],
)
def test_no_repeated_blocks_detects_nothing(model: nn.Module):
    assert detect_blocks(model) == ()


class MlpBlock(nn.Module):
    """A block that keeps its MLP in a Sequential, as many models do: two Linears in a container each."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


def test_a_class_inside_a_repeated_block_is_not_a_block():
    # 24 Linears in the blocks' Sequentials outnumber the 12 blocks; checkpointing one Linear saves nothing.
    decoder = nn.ModuleDict(
        {"embed": nn.Embedding(16, WIDTH), "blocks": nn.ModuleList(MlpBlock() for _ in range(12))}
    )
    assert detect_blocks(decoder) == ("MlpBlock",)
    assert count_blocks(decoder, ("MlpBlock",)) == {"MlpBlock": 12}
    assert count_blocks(decoder, ("Linear",)) == {"Linear": 24}


def test_of_the_outermost_repeated_classes_the_one_holding_the_most_parameters_wins():
    # Three Linears in a head Sequential outnumber two Blocks, which hold more parameters.
    with_head = nn.ModuleDict(
        {
            "head": nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(3))),
            "blocks": nn.ModuleList([Block(), Block()]),
        }
    )
    assert detect_blocks(with_head) == ("Block",)
    wide_head = nn.ModuleDict(
        {
            "head": nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 512)),
            "blocks": nn.ModuleList([Block(), Block()]),
        }
    )
    assert detect_blocks(wide_head) == ("Linear",)  # parameters decide, not the order or the depth


def test_plain_containers_are_looked_into_never_wrapped():
    # One block per Sequential: the Sequentials are containers, the blocks inside them are repeated.
    wrapped = nn.ModuleList(nn.Sequential(Block()) for _ in range(3))
    assert detect_blocks(wrapped) == ("Block",)
    mlp = nn.Sequential(*(nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(3)))
    assert detect_blocks(mlp) == ("Linear",)
    assert detect_blocks(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))) == ("Linear",)


def test_wrapping_counts_the_blocks_and_is_idempotent():
    model = Net()
    assert wrap_blocks(model, ("Block",)) == 4
    assert wrap_blocks(model, ("Block",)) == 0  # already wrapped: not checkpointed twice
    assert wrap_blocks(Net(), ("NoSuchBlock",)) == 0


def _twins() -> tuple[Net, Net, torch.Tensor]:
    torch.manual_seed(0)
    plain, wrapped = Net(), Net()
    wrapped.load_state_dict(plain.state_dict())
    assert wrap_blocks(wrapped, detect_blocks(wrapped)) == 4
    return plain, wrapped, torch.randn(BATCH, 16)


@pytest.mark.slow
def test_recomputation_gives_the_same_loss_and_gradients():
    plain, wrapped, x = _twins()
    losses = []
    for model in (plain, wrapped):
        loss = model(x).square().mean()
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[0], losses[1])
    for (name, p), q in zip(plain.named_parameters(), wrapped.parameters()):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def _saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes autograd keeps for backward outside checkpointed regions (parameters and input excluded)."""
    skip = {p.data_ptr() for p in model.parameters()} | {x.data_ptr()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in skip:
            saved[t.data_ptr()] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).square().mean()
    loss.backward()
    return sum(saved.values())


@pytest.mark.slow
def test_recomputation_shrinks_the_activations_kept_for_backward():
    plain, wrapped, x = _twins()
    kept, recomputed = _saved_bytes(plain, x), _saved_bytes(wrapped, x)
    # Each block keeps its hidden layer (tanh's output, 4 x WIDTH wide, float32) for backward; wrapped,
    # it keeps only its input (to run again), like everything outside the blocks.
    hidden = BATCH * 4 * WIDTH * 4
    assert kept - recomputed >= 4 * hidden


def test_without_grad_a_wrapped_block_just_runs():
    plain, wrapped, x = _twins()
    with torch.no_grad():
        torch.testing.assert_close(plain(x), wrapped(x))
