"""Distributed strategies: how one rank's model is wrapped, with PyTorch's own engine.

``none``  one process, the model as built (today's single-process probe).
``ddp``   :class:`torch.nn.parallel.DistributedDataParallel` with its defaults (25 MiB gradient
          buckets beside the gradients, ``gradient_as_bucket_view=False``): the memory a DDP job sees.
``fsdp``  FSDP2: :func:`torch.distributed.fsdp.fully_shard` on each repeated block (the same block
          detection as recomputation, :func:`autobatch.step.recompute.detect_blocks`, or the classes the
          user names), then on the root, with FSDP2's defaults (``reshard_after_forward=True`` for the
          blocks, so ZeRO-3-like; the root keeps its parameters gathered after forward). Parameters,
          gradients and optimizer state are sharded across the ranks; the optimizer is built on the
          sharded (DTensor) parameters.

The process group must be initialised before :func:`wrapper` is called (``gloo`` on the CPU device,
``nccl`` on CUDA: :func:`backend_for`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from autobatch.core.space import STRATEGIES
from autobatch.step.recompute import detect_blocks

if TYPE_CHECKING:
    from autobatch.step.loop import Wrap

__all__ = ["STRATEGIES", "backend_for", "wrapper", "wrap_ddp", "wrap_fsdp"]


def backend_for(device: str) -> str:
    """The process-group backend of a device: ``nccl`` for CUDA, ``gloo`` for the CPU."""
    return "nccl" if device.startswith("cuda") else "gloo"


def wrapper(strategy: str, device: str, block_classes: tuple[str, ...] = ()) -> Wrap | None:
    """The wrapper of ``strategy`` on ``device`` (``None`` for ``none``)."""
    if strategy == "none":
        return None
    if strategy == "ddp":
        return lambda model: wrap_ddp(model, device)
    if strategy == "fsdp":
        return lambda model: wrap_fsdp(model, device, block_classes)
    raise ValueError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")


def wrap_ddp(model: torch.nn.Module, device: str) -> torch.nn.Module:
    """``DistributedDataParallel`` on this rank's device (``device_ids`` only on CUDA)."""
    from torch.nn.parallel import DistributedDataParallel

    dev = torch.device(device)
    return DistributedDataParallel(model, device_ids=[dev.index or 0] if dev.type == "cuda" else None)


def wrap_fsdp(
    model: torch.nn.Module, device: str, block_classes: tuple[str, ...] = (), *, mesh: Any = None
) -> torch.nn.Module:
    """FSDP2 on each repeated block, then on the root, over a 1-D mesh of every rank (``mesh``: one made
    beforehand, as a fake-tensor estimate must, outside ``FakeTensorMode``)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if mesh is None:
        mesh = init_device_mesh(torch.device(device).type, (dist.get_world_size(),))
    classes = block_classes or detect_blocks(model)
    for module in list(model.modules()):
        if module is not model and type(module).__name__ in classes:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model
