"""Plain records shared by the CLI side and the probe side of explain/estimate (no torch here).

The category names of a breakdown, the model changes two levers stand for (:class:`Transforms`), and
one step configuration to simulate (:class:`Scenario`). They cross the process boundary as dicts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: Categories a memory tracker assigns to tensor storages (see autobatch.explain.worker.tracker).
TENSOR_CATEGORIES: tuple[str, ...] = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer_state",
    "inputs",
    "activations",
    "autocast_copies",
    "temporaries",
)

#: Categories of ``explain --json``, in display order (``residual_bytes`` is reported beside them).
CATEGORIES: tuple[str, ...] = (
    "baseline",
    *TENSOR_CATEGORIES,
    "ddp_buckets",
    "fsdp_buffers",
    "runtime_overhead",
)

CATEGORY_HELP: dict[str, str] = {
    "baseline": "the process before the model (Python, torch, the script)",
    "parameters": "model parameters (tied weights once)",
    "buffers": "model buffers (BatchNorm running statistics, ...)",
    "gradients": "parameter gradients",
    "optimizer_state": "optimizer state (momentum, Adam's moments, Adafactor's factors)",
    "inputs": "the batch",
    "activations": "activations saved for backward",
    "autocast_copies": "low-precision weight copies cached by autocast",
    "temporaries": "intermediates not kept for backward (forward, backward, optimizer step)",
    "ddp_buckets": "DDP's gradient buckets: a flat copy of every gradient (explain --strategy ddp)",
    "fsdp_buffers": "FSDP2's all-gather and reduce-scatter buffers, unsharded parameters (--strategy fsdp)",
    "runtime_overhead": "CUDA caching allocator slack (reserved - allocated)",
    "residual": "untracked: library buffers (MKL, oneDNN, cuBLAS), allocator rounding, Python objects",
}


@dataclass(frozen=True)
class Transforms:
    """Model changes to apply (``vocab_trim``: the fraction of the vocabulary removed); see
    :mod:`autobatch.explain.worker.transforms`."""

    inplace: bool = False
    vocab_trim: float = 0.0

    @property
    def active(self) -> bool:
        return self.inplace or self.vocab_trim > 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Transforms:
        data = data or {}
        return cls(bool(data.get("inplace", False)), float(data.get("vocab_trim", 0.0)))


@dataclass(frozen=True)
class Scenario:
    """One step configuration to simulate."""

    precision: str
    optimizer: str
    recompute: bool
    transforms: Transforms = Transforms()
    level: str = "full"  # with recompute: full, selective or K/N (autobatch.core.levels)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "transforms": self.transforms.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scenario:
        return cls(
            str(data["precision"]),
            str(data["optimizer"]),
            bool(data["recompute"]),
            Transforms.from_dict(data.get("transforms")),
            str(data.get("level") or "full"),
        )
