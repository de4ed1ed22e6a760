"""The strategy of ``estimate --strategy ddp|fsdp --world-size N``: one rank of N, under fake tensors."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from autobatch.settings import planned_world

if TYPE_CHECKING:
    from autobatch.settings import Settings


def estimate_strategy(settings: Settings) -> dict[str, Any]:
    """``EstimateOptions`` fields: the strategy and the world it shards over (``world_size`` when set,
    else ``nproc_per_node x nnodes``)."""
    if settings.distributed.strategy == "none":
        return {}
    return {"strategy": settings.distributed.strategy, "world_size": planned_world(settings, os.environ)[0]}


def strategy_notes(info: dict[str, Any]) -> list[str]:
    """What a per-rank estimate is, and what it leaves out."""
    strategy = info.get("strategy")
    if not strategy:
        return []
    return [
        f"per rank: rank 0 of {strategy['world_size']} under {strategy['strategy']} in a fake process group "
        f"(torch.distributed 'fake' backend); leaves out {strategy['leaves_out']}"
    ]
