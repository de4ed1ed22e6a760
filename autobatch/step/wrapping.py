"""Distributed strategies: how one rank's model is wrapped, with PyTorch's own engine.

``none`` (the model as built), ``ddp`` (``DistributedDataParallel`` with its defaults) and ``fsdp``
(FSDP2's ``fully_shard`` on each repeated block, then the root). The process group must be initialised
first (``gloo`` on the CPU, ``nccl`` on CUDA: :func:`backend_for`). What each holds: docs/distributed.md.
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
