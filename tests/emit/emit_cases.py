"""Plans the emitter tests render: every precision, with and without accumulation, worlds 1 and 4.

A realistic result of a tune on an 80 GB GPU (``realistic_result``) gets its ``chosen`` replaced
per case. Golden files live in ``golden/<case>/<default file name>``; regenerate them with
``AUTOBATCH_UPDATE_GOLDEN=1 pytest tests/emit`` and review the diff.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

from autobatch.emit import EmitOptions
from autobatch.records.result import Chosen, ComboResult, ProbeRecord, TuneResult

GOLDEN = Path(__file__).resolve().parent / "golden"
DATA = Path(__file__).resolve().parent / "data"
UPDATE_GOLDEN = "AUTOBATCH_UPDATE_GOLDEN"

#: Fixed options, so that the files are byte-for-byte stable.
OPTIONS = EmitOptions(
    generated_by="autobatch tune examples/gpt.py --global-batch-size 240 --emit all",
    generated_at="2026-11-21T12:00:00+00:00",
    transformers_version="5.23.0",
)

#: One optimizer per precision, so that the goldens cover several optimizer mappings.
OPTIMIZER_FOR = {
    "32-true": "sgd-momentum",
    "bf16-mixed": "adamw",
    "16-mixed": "adam",
    "bf16-true": "adafactor",
}

GIB = 1024**3


@dataclass(frozen=True)
class Case:
    name: str
    precision: str
    optimizer: str
    recompute: bool
    micro: int
    accumulation: int
    world: int
    requested: int | None
    device: str = "cuda"
    note: str | None = None

    @property
    def global_batch(self) -> int:
        return self.micro * self.accumulation * self.world

    def chosen(self) -> Chosen:
        return Chosen(
            precision=self.precision,
            optimizer=self.optimizer,
            recompute=self.recompute,
            micro_batch_size=self.micro,
            accumulation_steps=self.accumulation,
            world_size=self.world,
            global_batch_size=self.global_batch,
            requested_global_batch_size=self.requested,
            exact=self.requested is None or self.requested == self.global_batch,
            note=self.note,
        )

    def result(self) -> TuneResult:
        result = realistic_result(self.device)
        result.chosen = self.chosen()
        return result


def _plan_cases() -> list[Case]:
    cases = []
    for precision, optimizer in OPTIMIZER_FOR.items():
        for world in (1, 4):
            cases.append(
                Case(f"{precision}_noaccum_w{world}", precision, optimizer, False, 64, 1, world, 64 * world)
            )
            cases.append(
                Case(f"{precision}_accum_w{world}", precision, optimizer, True, 12, 5, world, 60 * world)
            )
    return cases


PLAN_CASES = _plan_cases()
INEXACT = Case(
    "inexact",
    "bf16-mixed",
    "adamw",
    False,
    11,
    8,
    4,
    350,
    note="no exact split of 350 over world 4 with micro-batch <= 18; closest: 11 x 8 x 4 = 352 (+0.6%). "
    "The effective batch is larger than requested: scale a linearly-scaled learning rate by 352/350 = 1.006.",
)
CPU = Case("cpu_bf16", "bf16-mixed", "sgd", False, 48, 2, 1, 96, device="cpu")
NO_REQUEST = Case("no_request", "32-true", "rmsprop", False, 128, 1, 1, None)
FUSED = Case("adamw_fused", "bf16-mixed", "adamw-fused", True, 24, 2, 4, 192)
ADAGRAD = Case("adagrad", "32-true", "adagrad", False, 40, 3, 2, 240)
CASES = [*PLAN_CASES, INEXACT, CPU, NO_REQUEST, FUSED, ADAGRAD]
CASE_IDS = [c.name for c in CASES]
BY_NAME = {c.name: c for c in CASES}
#: Cases whose whole result (json, toml) is also kept as a golden file.
WHOLE_CASES = ["bf16-mixed_accum_w4", "inexact", "cpu_bf16"]


def realistic_result(device: str = "cuda") -> TuneResult:
    """A tune of a small GPT on an A100 (or on a 2 GiB CPU cap): two precisions x two optimizers x recompute."""
    if device == "cuda":
        device_info = {
            "type": "cuda",
            "name": "NVIDIA A100-SXM4-80GB",
            "capacity_bytes": 85_899_345_920,
            "budget_bytes": 76_398_018_560,
            "headroom": 0.1,
            "memory_definition": "torch.cuda.set_per_process_memory_fraction over the device's free memory "
            "minus the CUDA context",
        }
    else:
        device_info = {
            "type": "cpu",
            "name": "x86_64 (2 cores)",
            "requested": "cpu",  # --device cpu: asked for, so launcher configs may come from it
            "capacity_bytes": 2 * GIB,
            "budget_bytes": int(1.8 * GIB),
            "headroom": 0.1,
            "memory_definition": "RLIMIT_DATA of the probe process, imports included",
        }
    combos = []
    for i, (precision, optimizer, recompute) in enumerate(
        [(p, o, r) for p in ("32-true", "bf16-mixed") for o in ("adamw", "sgd") for r in (False, True)]
    ):
        top = 40 + 8 * i
        trace = [
            ProbeRecord(
                batch_size=1, kind="fits", peak_bytes=9 * GIB, steps=3, seconds=1.5, samples_per_second=40.0
            ),
            ProbeRecord(
                batch_size=top,
                kind="fits",
                peak_bytes=70 * GIB,
                steps=10,
                seconds=4.0,
                samples_per_second=310.5,
            ),
            ProbeRecord(batch_size=top + 1, kind="oom", steps=1, seconds=0.8),
        ]
        combos.append(
            ComboResult(
                precision=precision,
                optimizer=optimizer,
                recompute=recompute,
                status="exact",
                max_batch_size=top,
                peak_bytes=70 * GIB,
                samples_per_second=310.5 + i,
                probes=len(trace),
                static_bytes={
                    "parameters": 2 * GIB,
                    "gradients": 2 * GIB,
                    "optimizer": 4 * GIB if optimizer == "adamw" else 0,
                },
                bytes_per_sample=1.5 * GIB,
                knee_batch_size=top // 2,
                trace=trace,
            )
        )
    combos.append(
        ComboResult(
            precision="16-mixed",
            optimizer="adamw",
            recompute=False,
            status="skipped",
            probes=0,
            reason="pruned: cannot beat bf16-mixed under the throughput objective",
        )
    )
    return TuneResult(
        script="examples/gpt.py",
        script_args=["--size", "small"],
        device=device_info,
        objective="throughput",
        combinations=copy.deepcopy(combos),
        chosen=None,
        status="complete",
        probes=sum(c.probes for c in combos),
        probe_overhead_seconds=0.18,
        wall_seconds=95.2,
        torch_version="2.13.0",
        autobatch_version="0.1.0",
        created="2026-11-20T09:30:00+00:00",
        notes=["recompute wraps 12 blocks of class Block"],
    )
