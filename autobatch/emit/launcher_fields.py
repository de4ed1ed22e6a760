"""What the tuned distributed strategy sets in each launcher config (pure; the emitters merge it in).

The maximum was measured with a strategy (``Chosen.strategy``: none, ddp or fsdp), so a config that
trains with another one would not hold it. For ``fsdp`` every launcher gets FSDP2 wrapping the same
block classes the probes wrapped (``TuneResult.distributed["blocks"]``), resharding after forward;
for ``ddp`` the launcher's plain data parallelism. Processes per node and nodes come from
``Chosen.nproc_per_node`` and ``Chosen.num_nodes``.
"""

from __future__ import annotations

from typing import Any

from autobatch.records.result import Chosen, TuneResult


def blocks(result: TuneResult) -> list[str]:
    """The block classes the FSDP probes wrapped (empty: none detected, the root alone)."""
    return list(result.distributed.get("blocks", []))


def accelerate_fields(result: TuneResult, chosen: Chosen) -> dict[str, Any]:
    """accelerate launch config: ``FSDP`` with an ``fsdp_config`` (FSDP2), and the machines."""
    if chosen.strategy == "none":
        return {}
    fields: dict[str, Any] = {"num_machines": chosen.num_nodes}
    if chosen.strategy == "fsdp":
        config: dict[str, Any] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": True,
            "fsdp_offload_params": False,
        }
        if blocks(result):
            config["fsdp_auto_wrap_policy"] = "TRANSFORMER_BASED_WRAP"
            config["fsdp_transformer_layer_cls_to_wrap"] = ",".join(blocks(result))
        fields.update(distributed_type="FSDP", fsdp_config=config)
    return fields


def lightning_fields(chosen: Chosen) -> dict[str, Any]:
    """Lightning Trainer: ``strategy``, ``devices`` per node and ``num_nodes``."""
    if chosen.strategy == "none":
        return {}
    return {"strategy": chosen.strategy, "devices": chosen.nproc_per_node, "num_nodes": chosen.num_nodes}


def hf_fields(result: TuneResult, chosen: Chosen) -> dict[str, Any]:
    """TrainingArguments: ``fsdp`` and an ``fsdp_config`` of version 2 (DDP is the Trainer's default)."""
    if chosen.strategy != "fsdp":
        return {}
    config: dict[str, Any] = {"version": 2, "reshard_after_forward": True}
    if blocks(result):
        config["transformer_layer_cls_to_wrap"] = blocks(result)
    return {"fsdp": "full_shard auto_wrap", "fsdp_config": config}


def caveat(chosen: Chosen, launcher: str) -> list[str]:
    """The header line saying which strategy the maximum holds for."""
    if chosen.strategy == "none":
        return []
    line = (
        f"strategy {chosen.strategy}: the micro-batch was measured per rank with {chosen.strategy} on "
        f"{chosen.nproc_per_node} ranks; train with the same strategy ({chosen.nproc_per_node} processes "
        f"per node x {chosen.num_nodes} nodes)"
    )
    if chosen.strategy == "fsdp" and launcher == "lightning":
        line += "; Lightning's 'fsdp' is FSDP1 with its own wrapping: for FSDP2, ModelParallelStrategy + fully_shard"
    if chosen.strategy == "fsdp" and launcher == "deepspeed":
        line += (
            "; DeepSpeed has no FSDP: ZeRO-3 shards the same state, but the maximum was not measured with it"
        )
    return [line]
