"""Probe requests for tests, from one flat list of values (imported by name: tests/ is on sys.path)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from autobatch.records.protocol import ProbeRequest, RunConfig, StepConfig

STEP_FIELDS = {f.name for f in fields(StepConfig)}
RUN_FIELDS = {f.name for f in fields(RunConfig)}


def probe_request(
    batch_size: int = 8,
    precision: str = "32-true",
    optimizer: str = "adamw",
    *,
    budget_bytes: int = 1 << 30,
    min_steps: int = 3,
    max_steps: int = 8,
    timeout: float = 60.0,
    **values: Any,
) -> ProbeRequest:
    """A request whose step takes the values named as :class:`StepConfig`'s fields, its run those named as
    :class:`RunConfig`'s, the request the others."""
    step = {k: v for k, v in values.items() if k in STEP_FIELDS}
    run = {k: v for k, v in values.items() if k in RUN_FIELDS}
    rest = {k: v for k, v in values.items() if k not in STEP_FIELDS | RUN_FIELDS}
    if "fresh_offset_bytes" in run:
        run["fresh_offset_bytes"] = tuple(run["fresh_offset_bytes"])
    return ProbeRequest(
        StepConfig(batch_size, precision, optimizer, **step),
        RunConfig(budget_bytes, timeout, **run),
        min_steps,
        max_steps,
        **rest,
    )
