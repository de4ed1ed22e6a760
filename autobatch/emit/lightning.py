"""A LightningCLI YAML overlay: ``--config your.yaml --config lightning_overlay.yaml``.

It sets the Trainer's precision, accumulation, devices and accelerator, and the data module's batch size (at
``EmitOptions.lightning_batch_key``); the optimizer and recomputation are named in its header, not set. Where
each number lands: docs/clusters.md ("The Lightning overlay").
"""

from __future__ import annotations

from typing import Any

import yaml

from autobatch.emit import launcher_fields as strategy
from autobatch.emit.common import EmitOptions, comment_block, on_cpu, provenance, require_chosen, script_own
from autobatch.errors import UsageError
from autobatch.records.result import TuneResult


def overlay(result: TuneResult, options: EmitOptions) -> dict[str, Any]:
    """The overlay as a nested dict."""
    chosen = require_chosen(result)
    trainer: dict[str, Any] = {"accumulate_grad_batches": chosen.accumulation_steps}
    if not script_own(chosen):
        trainer = {"precision": chosen.precision, **trainer}
    if chosen.world_size == 1:
        trainer.update(devices=1, num_nodes=1)
    if on_cpu(result):
        trainer["accelerator"] = "cpu"
    trainer.update(strategy.lightning_fields(chosen))
    data: dict[str, Any] = {"trainer": trainer}
    *parents, leaf = options.lightning_batch_key.split(".")
    node = data
    for i, part in enumerate(parents):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise _clash(options.lightning_batch_key, ".".join(parents[: i + 1]))
        node = child
    if leaf in node:
        raise _clash(options.lightning_batch_key, options.lightning_batch_key)
    node[leaf] = chosen.micro_batch_size
    return data


def _clash(key: str, taken: str) -> UsageError:
    return UsageError(
        f"the Lightning batch-size key {key!r} collides with {taken!r}, which autobatch sets itself",
        hint="pass the data module's batch-size key, such as data.batch_size (--lightning-batch-key)",
    )


def caveats(result: TuneResult, options: EmitOptions) -> list[str]:
    chosen = require_chosen(result)
    notes = strategy.caveat(chosen, "lightning")
    if chosen.world_size > 1 and chosen.strategy == "none":
        notes.append(
            f"world size {chosen.world_size}: set trainer.devices x trainer.num_nodes = {chosen.world_size} "
            "for your cluster (not set here)"
        )
    if not script_own(chosen):
        notes.append(
            f"optimizer {chosen.optimizer} is not set here (LightningCLI's optimizer key would replace "
            "your configure_optimizers); build it in your module"
        )
    if chosen.recompute:
        notes.append(
            "recompute: the Trainer has no flag for it; checkpoint your model's blocks "
            "(torch.utils.checkpoint, or the FSDP strategy's activation_checkpointing_policy)"
        )
    return notes


def render_lightning(result: TuneResult, options: EmitOptions) -> str:
    """The overlay YAML, headed by its provenance and batch arithmetic."""
    data = overlay(result, options)
    header = provenance(result, options, "LightningCLI overlay")
    header += caveats(result, options)
    header.append("use: python train.py fit --config your_config.yaml --config <this file>")
    return comment_block(header) + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
