"""The guard across ranks: one agreement per global batch, and the gradient sync around it.

Every rank ends each attempt at a batch in one all-reduce (MAX) of ``[ran out, allocator retried]``.
Under DDP the micro-batches run with no collective in flight (``no_sync``), and only when no rank ran out
are the gradients averaged, bucket by bucket. Under FSDP2 the forward and backward run FSDP's own
collectives, so the same all-reduce also runs before each of them (:class:`CheckedAllGather`,
:class:`CheckedReduceScatter`): a rank that ran out answers the others' next check instead of their
collective, and they leave the batch with it (:class:`PeerRanOut`). Why, and the limits: docs/guard.md
("Ranks").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

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


class PeerRanOut(Exception):
    """Another rank ran out of memory in this batch: raised at a check before an FSDP collective, whose
    all-reduce was this rank's agreement for the batch (no further one follows)."""


def check(group: Group) -> None:
    """The all-reduce a rank joins before each FSDP collective: raise :class:`PeerRanOut` when a rank that
    ran out answers it (with its agreement) instead of a check of its own."""
    if agree(group, False, False)[0]:
        raise PeerRanOut("another rank ran out of memory in this batch")


class CheckedAllGather:
    """FSDP2's all-gather (``set_custom_all_gather``), after a :func:`check`."""

    def __init__(self, group: Group) -> None:
        self.group = group

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        import torch

        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        async_op: bool = False,
    ) -> Any:
        import torch.distributed as dist

        check(self.group)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return gather(output_tensor, input_tensor, group=group, async_op=async_op)


class CheckedReduceScatter(CheckedAllGather):
    """FSDP2's reduce-scatter (``set_custom_reduce_scatter``), after a :func:`check`."""

    def __call__(  # type: ignore[override]
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> Any:
        import torch.distributed as dist

        check(self.group)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return scatter(output_tensor, input_tensor, op=op, group=group, async_op=async_op)


def fsdp_modules(model: torch.nn.Module) -> list[Any]:
    """The FSDP2 modules in the model (``fully_shard``), outermost first."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def check_fsdp(group: Group, model: torch.nn.Module) -> None:
    """Put a :func:`check` before every collective FSDP2 runs for this model (every rank, once)."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    from autobatch.errors import UsageError

    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        raise UsageError(
            "the guard runs FSDP2 (`fully_shard`), not the older FullyShardedDataParallel wrapper",
            hint="shard the model with torch.distributed.fsdp.fully_shard",
        )
    needs = ("set_custom_all_gather", "set_custom_reduce_scatter", "reset_iter_state")
    missing = [name for name in needs if not hasattr(FSDPModule, name)]
    if missing:
        raise UsageError(
            f"this torch's FSDP2 lacks {', '.join(missing)}, which the guard needs to keep the ranks in step",
            hint="upgrade torch (2.13 has them), or run the guard with DDP",
        )
    for module in fsdp_modules(model):
        module.set_custom_all_gather(CheckedAllGather(group))
        module.set_custom_reduce_scatter(CheckedReduceScatter(group))


def reset_fsdp(model: torch.nn.Module) -> None:
    """After a batch abandoned mid-flight: FSDP2 reshards and forgets the iteration (on its root module)."""
    modules = fsdp_modules(model)
    if modules:
        modules[0].reset_iter_state()


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
    "CheckedAllGather",
    "CheckedReduceScatter",
    "Group",
    "PeerRanOut",
    "agree",
    "average_gradients",
    "broadcast_buffers",
    "check",
    "check_fsdp",
    "current_group",
    "fsdp_modules",
    "is_ddp",
    "is_fsdp",
    "reset_fsdp",
]
