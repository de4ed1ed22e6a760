"""Distributed strategies in the plan: world size and node count (pure).

A tune with a strategy measures one node's ``nproc_per_node`` ranks; the job's world size is
``nproc_per_node x nnodes`` unless ``world_size`` is set (:func:`strategy_world`), and the emitted
configs name the strategy, the processes per node and the nodes (:func:`strategy_fields`). A plan for
several processes measured in one (no strategy: ``world_size``, ``WORLD_SIZE`` or SLURM's variables) is launched
as that many processes on one node, the split the job's command can name without knowing its nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def strategy_world(
    strategy: str, nproc_per_node: int, nnodes: int | None, env: Mapping[str, str]
) -> tuple[int, str] | None:
    """The world size a strategy implies and where it came from; None when there is no strategy.

    ``nnodes``: the setting; unset, SLURM's node count (``SLURM_JOB_NUM_NODES``/``SLURM_NNODES``), else 1.
    """
    if strategy == "none":
        return None
    if nnodes is not None:
        return nproc_per_node * nnodes, f"nproc_per_node x nnodes ({nproc_per_node} x {nnodes})"
    for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        raw = env.get(name, "").strip()
        if raw.isdigit() and int(raw) >= 1:
            nodes = int(raw)
            return nproc_per_node * nodes, f"nproc_per_node x {name} ({nproc_per_node} x {nodes})"
    return nproc_per_node, f"nproc_per_node ({nproc_per_node}) x 1 node"


def strategy_fields(strategy: str, nproc_per_node: int, world_size: int) -> dict[str, Any]:
    """The ``Chosen`` fields of a strategy: processes per node and nodes (1 node when they do not divide).

    Without a strategy the plan's whole world on one node: its command (``torchrun --nproc-per-node=W``) then
    runs the world the global batch is planned for, not one process of it."""
    if strategy == "none":
        return {"strategy": "none", "nproc_per_node": world_size, "num_nodes": 1}
    nodes = world_size // nproc_per_node if world_size % nproc_per_node == 0 else 1
    return {"strategy": strategy, "nproc_per_node": nproc_per_node, "num_nodes": max(1, nodes)}
