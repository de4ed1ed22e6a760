"""One rank of a distributed strategy under fake tensors: ``estimate --strategy ddp|fsdp --world-size N``.

The recipe torchtitan's memory estimation follows (checked with torch 2.13 on the CPU):
``torch.distributed``'s ``fake`` backend with ``torch.testing._internal.distributed.fake_pg.FakeStore``
lets this one process act as rank 0 of any world size (collectives return at once, moving no data);
the device mesh is made *before* ``FakeTensorMode`` is entered (inside it, ``fully_shard`` fails on a
data-dependent op); the model is then built under fake tensors by the probe's own step
(:func:`autobatch.step.loop.build_step`), wrapped by the same :func:`autobatch.step.wrapping.wrap_fsdp`
as a measured FSDP2 probe (each repeated block, then the root), and stepped with an optimizer built on
the sharded parameters. Building straight on fake tensors replaces the recipe's ``meta`` device and
``to_empty``: both give parameters with no storage, and fake ones also run the step.

What the tracker counts is what this rank holds. FSDP2's sharded parameters, their gradients and the
optimizer state built on them are DTensors: wrappers whose own storage has the *global* size, over a
local shard of about 1/N of it. The tracker therefore lets every DTensor operation desugar into the
operations on the local shards, which it sees and counts, and counts a DTensor by its inner tensors'
storages (:func:`~autobatch.explain.worker.tracker.storages_of`), as ``torch.distributed._tools.MemTracker``
does; counting the wrappers made every rank hold the whole model's state (the FSDP estimate was
0.54 x the measured 2-rank maximum on the distributed docs' MLP). The unsharded parameters a block all-gathers
are plain tensors, freed and refilled with ``UntypedStorage.resize_`` (:func:`track_resize`).

``ddp``: the step of one process plus DDP's gradient buckets, which hold a flat copy of every gradient
from construction on (``gradient_as_bucket_view=False``, DDP's default): :meth:`FakeRank.extra_bytes`.
DDP itself is not constructed under fake tensors (its C++ reducer allocates outside the tracker).
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
