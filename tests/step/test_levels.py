"""Recomputation levels: which blocks a level checkpoints, and what each level does to a step's peak.

The peak is the step's live tensor bytes at their high-water mark, read in-process by explain's
``MemoryTracker`` (a dispatch mode that sees every storage the step creates and frees, selective
checkpointing's saved outputs included), on a small decoder: 8 blocks of written-out attention and an MLP.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autobatch.core.step_peaks import StepRule
from autobatch.errors import NoBlocksError
from autobatch.explain.worker.tracker import MemoryTracker
from autobatch.step.contract import UserScript
from autobatch.step.loop import StepConfig, StepReport, run_steps
from autobatch.step.recompute import SAVED_OPS, level_blocks, split_level, wrap_recompute

WIDTH, HEADS, TOKENS, DEPTH, VOCAB, BATCH = 32, 2, 32, 8, 64, 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, w // HEADS).permute(2, 0, 3, 1, 4)
        attention = ((q @ k.transpose(-2, -1)) / math.sqrt(w // HEADS)).softmax(dim=-1)
        x = x + self.proj((attention @ v).transpose(1, 2).reshape(b, t, w))
        return x + self.mlp(self.norm2(x))


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _build() -> Decoder:
    torch.manual_seed(0)
    return Decoder()


def _batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (batch_size, TOKENS + 1), generator=torch.Generator().manual_seed(0))
    return ids[:, :-1], ids[:, 1:]


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]).flatten(0, 1), batch[1].flatten())


SCRIPT = UserScript(Path("<decoder>"), ModuleType("decoder"), _build, _batch, _loss)


# --- the pure part ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("level", "n", "blocks"),
    [
        ("full", 4, [0, 1, 2, 3]),
        ("selective", 3, [0, 1, 2]),
        ("1/4", 4, [0]),
        ("3/4", 4, [0, 1, 2]),
        ("6/12", 12, [0, 1, 2, 3, 4, 5]),
        ("11/12", 12, list(range(11))),
    ],
)
def test_a_level_checkpoints_the_first_k_blocks(level: str, n: int, blocks: list[int]) -> None:
    assert level_blocks(level, n) == blocks


@pytest.mark.parametrize(
    "level", ["0/4", "4/4", "5/4", "half", "3/", "/4", "-1/4", "1/4/8", "", "Full", " 1/4"]
)
def test_a_malformed_level_is_a_programming_error(level: str) -> None:
    with pytest.raises(ValueError, match="recomputation level"):
        split_level(level)


def test_split_level() -> None:
    assert split_level("full") is None and split_level("selective") is None
    assert split_level("6/12") == (6, 12)
    with pytest.raises(ValueError, match="for 12 blocks, not 8"):
        level_blocks("6/12", 8)


def test_a_level_for_another_number_of_blocks_names_both() -> None:
    with pytest.raises(
        NoBlocksError, match=r"checkpoints 6 of 12 blocks, but the model holds 8 \(Block x 8\)"
    ) as err:
        wrap_recompute(_build(), (), "6/12")
    assert err.value.hint is not None and "K/8" in err.value.hint


def test_a_k_of_n_level_wraps_the_first_k_in_module_order() -> None:
    model = _build()
    assert wrap_recompute(model, (), "3/8") == ("Block",)
    wrapped = [getattr(block, "_autobatch_recompute", False) for block in model.blocks]
    assert wrapped == [True] * 3 + [False] * 5


@pytest.mark.parametrize("level", ["3/8", "selective", "full"])
@pytest.mark.slow
def test_every_level_gives_the_same_loss_and_gradients(level: str) -> None:
    plain, wrapped = _build(), _build()
    wrap_recompute(wrapped, (), level)
    grads = []
    for model in (plain, wrapped):
        loss = _loss(model, _batch(4))
        loss.backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_the_selective_policy_saves_matmuls_and_attention_and_recomputes_the_rest() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import CheckpointPolicy

    from autobatch.step.recompute import _policy

    aten = torch.ops.aten
    for op in (
        aten.mm.default,
        aten.addmm.default,
        aten.bmm.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
    ):
        assert _policy(None, op) == CheckpointPolicy.MUST_SAVE, op
    for op in (aten.gelu.default, aten._softmax.default, aten.native_layer_norm.default, aten.add.Tensor):
        assert _policy(None, op) == CheckpointPolicy.PREFER_RECOMPUTE, op
    assert all(hasattr(aten, name) for name in SAVED_OPS)  # torch 2.13 has every one

    class Ops(TorchDispatchMode):  # what a CPU attention dispatches to: one of the saved ops
        seen: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.seen.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    q = torch.randn(2, 2, 8, 4, requires_grad=True)
    with Ops():
        F.scaled_dot_product_attention(q, q, q)
    assert set(Ops.seen) & set(SAVED_OPS), Ops.seen


# --- what the levels do to a step's peak --------------------------------------------------------


def _step_peak(recompute: bool, level: str = "full") -> int:
    """One step of the decoder through the step loop, with the level in its config; its tensors' peak."""
    tracker = MemoryTracker()
    config = StepConfig(BATCH, "32-true", "sgd", level=level if recompute else "off")
    with tracker:
        report = run_steps(
            SCRIPT,
            config,
            StepReport(),
            StepRule(1, 1, 0),
            peak_now=lambda: tracker.peak.tensor_bytes,
            synchronize=lambda: None,
        )
    assert report.recompute_blocks == (("Block",) if recompute else ())
    return tracker.peak.tensor_bytes


@pytest.mark.slow
def test_the_peak_falls_from_off_to_k_of_n_to_full_linearly_and_selective_lies_between() -> None:
    off = _step_peak(False)
    split = {k: _step_peak(True, f"{k}/{DEPTH}") for k in (2, 4, 6)}
    full = _step_peak(True, "full")
    selective = _step_peak(True, "selective")
    assert off > split[2] > split[4] > split[6] > full
    # Every block checkpointed keeps only its input: the peak falls by one block's activations per block.
    per_block = (off - split[6]) / 6
    for k, peak in split.items():
        assert peak == pytest.approx(off - k * per_block, rel=0.02), k
    # "full" checkpoints the last block too, whose recomputation comes first in backward, at the peak: it buys
    # that block's input, not its activations (the first K are checkpointed for that reason).
    assert off - full > 6 * per_block
    assert full < off - 7 * per_block + per_block / 2
    # Selective keeps the matmuls' outputs (the attention scores among them) and recomputes the rest.
    assert full < selective < off
