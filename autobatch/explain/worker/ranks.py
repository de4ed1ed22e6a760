"""One rank of a distributed strategy under fake tensors: ``estimate --strategy ddp|fsdp --world-size N``.

Rank 0 of any world size in ``torch.distributed``'s ``fake`` process group, the device mesh made before
``FakeTensorMode`` is entered, the model built by the probe's own step and wrapped as a measured FSDP2 probe
wraps it. DTensors are counted by their local shards (:func:`track_resize` follows the all-gathered
parameters); ``ddp`` adds the gradient buckets (:meth:`FakeRank.extra_bytes`). The recipe and why:
docs/distributed.md ("Estimates per rank").
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from autobatch.explain.worker.tracker import MemoryTracker
from autobatch.step.contract import UserScript
from autobatch.step.wrapping import wrap_fsdp

#: What a per-rank estimate leaves out (said in its output).
LEAVES_OUT = (
    "communication buffers and runtime outside PyTorch's allocator (NCCL communicators: hundreds of MiB "
    "per rank on CUDA; gloo threads on the CPU: about 30 MiB per rank, seen here), the CUDA context of "
    "each rank beyond the card profile, and the overlap of one block's all-gather with the next's compute"
)


@dataclass(frozen=True)
class FakeRank:
    """Rank 0 of ``world_size`` in a fake process group, with the strategy's wrapper."""

    strategy: str
    world_size: int
    mesh: Any
    blocks: tuple[str, ...]

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.strategy == "fsdp":
            return wrap_fsdp(model, "cpu", self.blocks, mesh=self.mesh)
        return model  # ddp: the model as is; its buckets are extra_bytes

    def extra_bytes(self, static: dict[str, int]) -> int:
        """Memory the simulation does not allocate but the strategy holds: DDP's gradient buckets."""
        return int(static.get("gradients", 0)) if self.strategy == "ddp" else 0


def rank_of(
    strategy: str, world_size: int, script: UserScript, recompute_classes: tuple[str, ...]
) -> FakeRank | None:
    """The fake rank for ``strategy`` (None for ``none``); call it outside ``FakeTensorMode``."""
    if strategy == "none":
        return None
    mesh = fake_mesh(world_size) if strategy == "fsdp" else None
    return FakeRank(strategy, world_size, mesh, recompute_classes or script.recompute_classes)


@contextlib.contextmanager
def track_resize(tracker: MemoryTracker) -> Iterator[None]:
    """Let ``tracker`` see ``UntypedStorage.resize_`` (FSDP2's free and refill of unsharded parameters),
    as ``torch.distributed._tools.MemTracker`` does: the dispatcher does not see it."""
    original = torch.UntypedStorage.resize_

    @functools.wraps(original)
    def resize_(storage: torch.UntypedStorage, size: int) -> Any:
        out = original(storage, size)
        tracker.resized(storage, int(size))
        return out

    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = original  # type: ignore[method-assign]


@functools.cache
def fake_mesh(world_size: int) -> Any:
    """The ``fake`` process group of ``world_size`` (this process is rank 0) and its 1-D CPU mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    return init_device_mesh("cpu", (world_size,))
