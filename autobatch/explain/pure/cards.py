"""Named GPU card profiles for ``autobatch estimate --card``: memory, and the runtime overhead assumed.

Each profile gives the card's memory as PyTorch reports it (``total_memory``, a little under the
marketing figure), the CUDA context assumed (outside the caching allocator, subtracted from the budget
as ``autobatch tune`` subtracts the measured one on a real GPU) and the workspaces assumed inside the
allocator (cuBLAS and cuDNN handles' workspaces, which a simulation on the CPU does not see). The
context grows with the number of kernels loaded; the figures are typical for a recent PyTorch and
CUDA 12, and are assumptions, not measurements: a tune on the real card is the authority.
``bf16`` says whether the card runs bfloat16 natively (Ampere and later); bf16 precisions are
skipped on cards without it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from autobatch.errors import UsageError

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class CardProfile:
    name: str
    description: str
    memory_bytes: int
    context_bytes: int = 512 * MiB
    workspace_bytes: int = 64 * MiB
    bf16: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gib(value: float) -> int:
    return int(value * GiB)


CARDS: dict[str, CardProfile] = {
    card.name: card
    for card in (
        CardProfile("t4-16gb", "NVIDIA T4 16 GB (Turing)", _gib(14.58), 400 * MiB, 32 * MiB, bf16=False),
        CardProfile("v100-16gb", "NVIDIA V100 16 GB (Volta)", _gib(15.77), 400 * MiB, 32 * MiB, bf16=False),
        CardProfile("v100-32gb", "NVIDIA V100 32 GB (Volta)", _gib(31.74), 400 * MiB, 32 * MiB, bf16=False),
        CardProfile("rtx3090-24gb", "NVIDIA GeForce RTX 3090 24 GB", _gib(23.69), 450 * MiB, 64 * MiB),
        CardProfile("a10-24gb", "NVIDIA A10 24 GB", _gib(22.07), 450 * MiB, 64 * MiB),
        CardProfile("rtx4090-24gb", "NVIDIA GeForce RTX 4090 24 GB", _gib(23.64), 450 * MiB, 64 * MiB),
        CardProfile("l4-24gb", "NVIDIA L4 24 GB", _gib(22.05), 450 * MiB, 64 * MiB),
        CardProfile("a100-40gb", "NVIDIA A100 40 GB", _gib(39.39), 500 * MiB, 64 * MiB),
        CardProfile("a100-80gb", "NVIDIA A100 80 GB", _gib(79.15), 500 * MiB, 64 * MiB),
        CardProfile("l40s-48gb", "NVIDIA L40S 48 GB", _gib(44.39), 500 * MiB, 64 * MiB),
        CardProfile("h100-80gb", "NVIDIA H100 80 GB (SXM/PCIe)", _gib(79.10), 550 * MiB, 96 * MiB),
        CardProfile("h200-141gb", "NVIDIA H200 141 GB", _gib(139.8), 550 * MiB, 96 * MiB),
    )
}

#: The profile ``--memory`` alone stands for: a card of that size with typical overheads.
GENERIC = CardProfile("generic", "a CUDA card with the given memory", 0, 512 * MiB, 64 * MiB)


def get_card(name: str) -> CardProfile:
    """The named profile; an unknown name is a usage error listing the known ones."""
    key = name.strip().lower()
    if key in CARDS:
        return CARDS[key]
    import difflib

    close = difflib.get_close_matches(key, list(CARDS), n=1)
    raise UsageError(
        f"unknown card {name!r}" + (f" (did you mean {close[0]}?)" if close else ""),
        hint=f"use one of {', '.join(CARDS)}, or give --memory SIZE for any other card",
    )


def generic_card(memory_bytes: int) -> CardProfile:
    """A card of ``memory_bytes`` with the generic overheads."""
    return CardProfile(
        "generic",
        GENERIC.description,
        memory_bytes,
        GENERIC.context_bytes,
        GENERIC.workspace_bytes,
    )
