"""Load DeepSpeed configs with DeepSpeed's own config class, at a given data-parallel world size.

Run as a script (one fresh process, so that the process group it starts touches no test)::

    python ds_consumer.py '[["path/to/ds_config.json", 4], ...]'

prints, after ``RESULT``, a JSON list with one entry per job: what
``deepspeed.runtime.config.DeepSpeedConfig`` made of the file, or ``{"error": "..."}`` when DeepSpeed
rejected it.

``DeepSpeedConfig`` takes its world size from ``deepspeed.comm`` (1 when no process group exists)
or, when given an ``mpu``, from ``mpu.get_data_parallel_world_size()``, and asserts
``train_batch_size == micro * accumulation * world``. With no GPUs here, this script starts a real
single-process gloo group on 127.0.0.1 and passes an mpu whose data-parallel size is the planned
world: DeepSpeed then runs its own batch assertion for that world. DeepSpeed's shared-memory
all-reduce kernel is marked unavailable first (its documented fallback on platforms without it):
building it costs about 80 s of C++ compilation on a fresh machine and plays no part in reading a
config.

For world-1 configs whose optimizer DeepSpeed builds from ``torch.optim`` (SGD, RMSprop, Adafactor,
Adagrad), it also runs ``deepspeed.initialize`` on a tiny fp32 model and reports the optimizer
class DeepSpeed built (the Adam family needs DeepSpeed's compiled FusedAdam, not buildable here).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any


class DataParallelMPU:
    """The smallest mpu DeepSpeedConfig accepts: a data-parallel world of ``world`` processes."""

    def __init__(self, world: int) -> None:
        self.world = world

    def get_data_parallel_world_size(self) -> int:
        return self.world

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_group() -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1"
    )
    import deepspeed
    import deepspeed.ops

    compatible = deepspeed.ops.__compatible_ops__
    for name in list(compatible):
        if "shm_comm" in name:
            compatible[name] = False
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)


def describe(path: str, world: int) -> dict[str, Any]:
    from deepspeed.runtime.config import DeepSpeedConfig

    try:
        config = DeepSpeedConfig(path, mpu=DataParallelMPU(world))
    except Exception as exc:  # DeepSpeed signals bad configs with AssertionError, ValueError, its own errors
        return {"error": f"{type(exc).__name__}: {exc}"}
    out: dict[str, Any] = {
        "world_size": config.world_size,
        "train_batch_size": config.train_batch_size,
        "train_micro_batch_size_per_gpu": config.train_micro_batch_size_per_gpu,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "bf16": config.bfloat16_config.enabled,
        "fp16": config.float16_config.enabled,
        "loss_scale": config.float16_config.loss_scale,
        "optimizer_name": config.optimizer_name,
        "optimizer_params": config.optimizer_params,
        "zero_stage": int(config.zero_optimization_stage),
        "zero_allow_untested_optimizer": config.zero_allow_untested_optimizer,
    }
    if (
        world == 1
        and config.optimizer_name in ("SGD", "RMSprop", "Adafactor", "adagrad")
        and not (out["bf16"] or out["fp16"])
    ):
        out["built_optimizer"] = build_optimizer(path)
    return out


def build_optimizer(path: str) -> str:
    import deepspeed
    import torch

    model = torch.nn.Linear(4, 2)
    try:
        engine, optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=path
        )
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}"
    inner = getattr(optimizer, "optimizer", optimizer)
    return f"{type(inner).__module__}.{type(inner).__name__} momentum={inner.defaults.get('momentum')}"


def main() -> None:
    jobs = json.loads(sys.argv[1])
    start_group()
    results = [describe(path, int(world)) for path, world in jobs]
    sys.stdout.write("\nRESULT " + json.dumps(results) + "\n")


if __name__ == "__main__":
    main()
