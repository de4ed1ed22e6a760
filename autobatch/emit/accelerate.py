"""An ``accelerate launch --config_file`` YAML, and where accelerate reads gradient accumulation.

The launch config holds the world size, the distributed type and the mixed precision; accumulation has no key
in it and goes to ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS`` in the env file, and the micro-batch stays the
DataLoader's. Where each number lands: docs/clusters.md ("The accelerate config").
"""

from __future__ import annotations

from typing import Any

import yaml

from autobatch.emit import launcher_fields as strategy
from autobatch.emit.common import EmitOptions, comment_block, on_cpu, provenance, require_chosen, script_own
from autobatch.records.result import TuneResult

MIXED_PRECISION = {"32-true": "no", "bf16-mixed": "bf16", "16-mixed": "fp16", "bf16-true": "bf16"}


def launch_config(result: TuneResult) -> dict[str, Any]:
    """The launch config dict, in the key order ``accelerate config`` writes."""
    chosen = require_chosen(result)
    cpu = on_cpu(result)
    if chosen.world_size == 1:
        distributed = "NO"
    else:
        distributed = "MULTI_CPU" if cpu else "MULTI_GPU"
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": distributed,
        "machine_rank": 0,
        "mixed_precision": MIXED_PRECISION.get(chosen.precision, "no"),
        "num_machines": 1,
        "num_processes": chosen.world_size,
        "use_cpu": cpu,
    }
    if script_own(chosen):  # the script's own Accelerator(mixed_precision=...) decides
        del config["mixed_precision"]
    if not cpu:
        config["gpu_ids"] = "all"
    config.update(strategy.accelerate_fields(result, chosen))
    return config


def caveats(result: TuneResult, options: EmitOptions) -> list[str]:
    chosen = require_chosen(result)
    notes = strategy.caveat(chosen, "accelerate") + [
        f"gradient accumulation: run ACCELERATE_GRADIENT_ACCUMULATION_STEPS={chosen.accumulation_steps} "
        "accelerate launch --config_file <this file> train.py (Accelerator() reads it; the env format "
        "exports it), or pass Accelerator(gradient_accumulation_steps=...)",
        f"micro-batch: set your DataLoader's batch_size to {chosen.micro_batch_size}",
    ]
    if chosen.precision == "bf16-true":
        notes.append(
            "bf16-true: accelerate has no pure-bf16 mode; mixed_precision is bf16, and the model "
            "must be cast to bfloat16 in your code"
        )
    if chosen.recompute:
        notes.append(
            "recompute: no launch setting for it; checkpoint your model's blocks (torch.utils.checkpoint)"
        )
    if chosen.world_size > 1:
        notes.append(
            "several machines: set num_machines, machine_rank and main_process_ip on each "
            "(num_processes stays the world size)"
        )
    if chosen.world_size > 1 and on_cpu(result):
        notes.append(multi_cpu_caveat(chosen.world_size, chosen.global_batch_size))
    return notes


def multi_cpu_caveat(world: int, global_batch: int) -> str:
    """What ``accelerate launch`` does with a MULTI_CPU config (``accelerate/commands/launch.py``): only with
    ``mpirun_hostfile`` does it start the ranks (through mpirun); without it, its simple launcher starts one
    process, whose Accelerator sees a world of 1, and the job trains at a fraction of the plan's global batch.
    Under torchrun, a CPU rank's Accelerator joins the world only with ``ACCELERATE_USE_CPU`` set."""
    return (
        f"CPU world {world}: accelerate launch starts MULTI_CPU's {world} processes only through mpirun "
        "(mpirun_hostfile in this file, or --mpirun_hostfile); without it, it starts one, and the global batch "
        f"is 1/{world} of {global_batch}. Or start the ranks with ACCELERATE_USE_CPU=true torchrun --standalone "
        f"--nproc-per-node {world} train.py (without ACCELERATE_USE_CPU, each rank's Accelerator() sees a world "
        "of 1)"
    )


def render_accelerate(result: TuneResult, options: EmitOptions) -> str:
    """The launch config YAML, headed by its provenance, batch arithmetic and accumulation command."""
    config = launch_config(result)
    header = provenance(result, options, "accelerate launch config") + caveats(result, options)
    return comment_block(header) + yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
