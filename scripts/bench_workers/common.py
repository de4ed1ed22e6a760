"""What every benchmark worker shares: load the workload, cap memory like autobatch, report one record.

A worker is started as ``python -m bench_workers.NAME REQUEST_JSON`` with the pinned allocator in its
environment. The request names the workload script, its arguments, the budget in bytes and the file
to write the record to. The record is written even when the method crashes (the error text is data);
only a process killed outright leaves no record, and the harness reports that from its exit status.

The batch sizes a method tries are counted by instrumenting ``make_batch`` and the training step:
:class:`Tries` records each size as it is used, and a *trial* is a run of consecutive uses of one size.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

#: The allocator settings of autobatch's CPU probes (autobatch.devices.cpu.MALLOC_ENV).
MALLOC_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}

#: Out-of-memory messages (for the record's "kind": an OOM that escaped the method is still an OOM).
OOM_MARKERS = ("DefaultCPUAllocator: can't allocate memory", "could not create a primitive", "out of memory")


@dataclass
class Request:
    script: str
    script_args: list[str]
    budget_bytes: int
    out: str
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_argv(cls, argv: list[str]) -> Request:
        return cls(**json.loads(argv[1]))


@dataclass
class Record:
    """What a worker reports: the method's answer, what it tried, and how it ended."""

    method: str
    found: int | None = None
    status: str = "ok"  # ok | nothing | crash
    error: str | None = None
    error_kind: str | None = None  # "oom" when the escaping error is a memory error
    tried: list[int] = field(default_factory=list)
    tuner_seconds: float = 0.0
    baseline_bytes: int | None = None
    budget_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def trials(self) -> int:
        return count_trials(self.tried)


def count_trials(tried: list[int]) -> int:
    """Runs of consecutive equal batch sizes: each is one trial (or one restart)."""
    return sum(1 for i, b in enumerate(tried) if i == 0 or tried[i - 1] != b)


class Tries:
    """Record every batch size as it is used (make_batch and the step call this)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def use(self, batch_size: int) -> None:
        if not self.sizes or self.sizes[-1] != batch_size:
            self.sizes.append(batch_size)


def vm_data() -> int:
    """VmData of this process in bytes: the quantity RLIMIT_DATA limits."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData in /proc/self/status")


def load_workload(request: Request) -> Any:
    """Import the workload the way autobatch does (never as __main__), plus the modules probes preload."""
    from autobatch.probe.server import preload
    from autobatch.step.contract import load_script

    script = load_script(request.script, request.script_args)
    preload()
    return script


def apply_cap(budget_bytes: int, reference_bytes: int | None = None) -> tuple[int, int]:
    """Cap data memory after imports, as autobatch's probes do; return (VmData then, the cap applied).

    The cap is the budget itself (the same cap, imports included), or, with ``reference_bytes`` (the
    VmData an autobatch probe starts with), the budget raised by whatever this process holds beyond
    that reference: the same room for the workload whatever the method imported ("equal room").
    """
    import torch

    # Start the intra-op (OpenMP) thread pool before measuring, as autobatch's probe does, so that its
    # thread stacks are part of what the process holds at the cap, not allocated mid-search.
    torch.ones(512, 512) @ torch.ones(512, 512)
    held = vm_data()
    cap = budget_bytes + (max(0, held - reference_bytes) if reference_bytes is not None else 0)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    return held, cap


def adamw_steps(script: Any, batch_size: int, steps: int, tries: Tries) -> None:
    """Build the workload's model, AdamW and one batch, then run full steps (the workload's own job)."""
    import torch

    model = script.build_model()
    optimizer = torch.optim.AdamW(model.parameters())
    tries.use(batch_size)
    batch = script.make_batch(batch_size)
    model.train()
    for _ in range(steps):
        loss = script.compute_loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def run_worker(method: str, body: Callable[[Request, Record, Tries], None]) -> None:
    """Load, cap, run ``body`` (which sets ``record.found``), and always write the record."""
    request = Request.from_argv(sys.argv)
    for key, value in MALLOC_ENV.items():
        if os.environ.get(key) != value:
            raise SystemExit(f"{method}: start the worker with {key}={value} in its environment")
    record = Record(method=method, budget_bytes=request.budget_bytes)
    tries = Tries()
    started = time.perf_counter()
    try:
        body(request, record, tries)
        if record.found is None and record.status == "ok":
            record.status = "nothing"
    except BaseException as exc:  # noqa: BLE001 - the method's failure is the measurement
        record.status = "crash"
        record.error = f"{type(exc).__name__}: {exc}".strip()[:2000]
        record.error_kind = "oom" if any(m in str(exc) for m in OOM_MARKERS) else None
        record.extra["traceback"] = traceback.format_exc()[-3000:]
    finally:
        record.tuner_seconds = time.perf_counter() - started - record.extra.get("setup_seconds", 0.0)
        record.tried = tries.sizes
        payload = {**asdict(record), "trials": record.trials}
        with open(request.out, "w") as handle:
            json.dump(payload, handle, indent=2)


def setup(request: Request, record: Record) -> Any:
    """Import the workload and apply the cap; time it, so that the tuner's own time excludes it."""
    started = time.perf_counter()
    script = load_workload(request)
    reference = request.options.get("reference_bytes")
    record.baseline_bytes, cap = apply_cap(request.budget_bytes, reference)
    record.extra["cap_bytes"] = cap
    record.extra["setup_seconds"] = time.perf_counter() - started
    return script
