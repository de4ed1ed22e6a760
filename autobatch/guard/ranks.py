"""The guard across ranks: one agreement per global batch, and DDP's gradient sync after it.

Every rank runs its micro-batches with no collective in flight (DDP's ``no_sync``), then every rank joins
one all-reduce (MAX) of ``[ran out, allocator retried]``. Only when no rank ran out are the gradients
averaged, bucket by bucket, so a rank that runs out of memory anywhere in its forward or backward never
leaves another waiting in a gradient all-reduce. The cost, and why not DDP's own sync on the last
micro-batch: docs/guard.md ("Ranks").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: Gradients are averaged in buckets of about this many bytes (DDP's default bucket size).
BUCKET_BYTES = 25 << 20


@dataclass(frozen=True)
class Group:
    """This process's place in the default process group (one rank, world 1, when there is none)."""

    rank: int
    world_size: int
    device: torch.device

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def current_group() -> Group:
    """The default process group as it stands (call after ``init_process_group``, if the job has ranks)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return Group(0, 1, torch.device("cpu"))
    backend = str(dist.get_backend()).lower()
    device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")
    return Group(dist.get_rank(), dist.get_world_size(), device)


def agree(group: Group, ran_out: bool, retried: bool) -> tuple[bool, bool]:
    """Whether any rank ran out, and whether any rank's allocator retried (one all-reduce; every rank)."""
    if not group.distributed:
        return ran_out, retried
    import torch
    import torch.distributed as dist

    flags = torch.tensor([int(ran_out), int(retried)], dtype=torch.int32, device=group.device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return bool(flags[0].item()), bool(flags[1].item())


def is_ddp(model: torch.nn.Module) -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(model, DistributedDataParallel)


def is_fsdp(model: torch.nn.Module) -> bool:
    """True for a model sharded with FSDP (``fully_shard`` or the older wrapper) anywhere in it."""
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    except ImportError:  # older torch
        return False
    return any(isinstance(m, (FSDPModule, FullyShardedDataParallel)) for m in model.modules())


def average_gradients(group: Group, model: torch.nn.Module) -> None:
    """Average every parameter's gradient over the ranks (SUM, then divide), bucket by bucket.

    Every rank must hold gradients for the same parameters, as DDP without ``find_unused_parameters``
    requires."""
    import torch
    import torch.distributed as dist

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    for bucket in _buckets(grads):
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat.div_(group.world_size)
        offset = 0
        for grad in bucket:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()


def broadcast_buffers(model: torch.nn.Module) -> None:
    """Rank 0's buffers to every rank, as DDP does before each forward it syncs (``broadcast_buffers``)."""
    import torch.distributed as dist

    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)


def _buckets(grads: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    bucket: list[torch.Tensor] = []
    size = 0
    for grad in grads:
        if bucket and (
            size + grad.numel() * grad.element_size() > BUCKET_BYTES or grad.dtype != bucket[0].dtype
        ):
            yield bucket
            bucket, size = [], 0
        bucket.append(grad)
        size += grad.numel() * grad.element_size()
    if bucket:
        yield bucket


__all__ = [
    "BUCKET_BYTES",
    "Group",
    "agree",
    "average_gradients",
    "broadcast_buffers",
    "current_group",
    "is_ddp",
    "is_fsdp",
]
