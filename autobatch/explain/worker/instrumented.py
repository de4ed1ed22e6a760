"""The instrumented real step of the ``explain`` operation, in this process (one probe, or one rank of a
distributed one: :mod:`autobatch.explain.worker.distributed`).

The worker's own probe (:func:`autobatch.probe.worker.measure_steps`: budget, steps, OOM classification
and peak exactly a probe's), with the options' model changes, instrumented by :class:`Instrument` unless
the options say not; its outcome carries the breakdown in ``info``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from autobatch.explain.pure.options import ExplainOptions
from autobatch.explain.worker.breakdown import Instrument
from autobatch.explain.worker.tracker import MemoryTracker
from autobatch.explain.worker.transforms import applied_during_step
from autobatch.probe.worker import measure_steps
from autobatch.records.protocol import ProbeOutcome, ProbeRequest
from autobatch.step.contract import UserScript
from autobatch.step.loop import tiny_step

if TYPE_CHECKING:
    from autobatch.step.loop import Wrap


def warm_up(precisions: set[str], optimizers: set[str], optimizer_kwargs: dict[str, Any]) -> None:
    """A tiny real step per optimizer and precision: loads what torch imports lazily (about 70 MiB of
    data memory on a first optimizer), so that a baseline read afterwards includes it."""
    for optimizer in sorted(optimizers):
        for precision in sorted(precisions):
            try:
                tiny_step(precision, optimizer, optimizer_kwargs.get(optimizer))
            except Exception:  # noqa: BLE001 - a warm-up failure shows up in the real step, if at all
                pass


def explain_step(
    request: ProbeRequest,
    script: UserScript,
    options: ExplainOptions,
    *,
    start: float | None = None,
    wrap: Wrap | None = None,
    around: Callable[[MemoryTracker | None], AbstractContextManager[Any]] | None = None,
) -> ProbeOutcome:
    """The explain operation's run in this process (``wrap``: a strategy's model wrapper on one rank;
    ``around``: a context the step runs in, given the tracker)."""
    step = request.step
    if request.device == "cpu":
        warm_up({step.precision}, {step.optimizer}, {step.optimizer: step.optimizer_kwargs})
    tracker = MemoryTracker() if options.instrument else None
    instrument = Instrument(options.transforms, tracker, seq_len=request.step.seq_len)
    start = time.perf_counter() if start is None else start
    context = around(instrument.tracker) if around is not None else contextlib.nullcontext()
    with applied_during_step(options.transforms, instrument.applied), instrument, context:
        outcome = measure_steps(request, instrument.wrap(script), start, wrap=wrap)
    info: dict[str, Any] = {"transforms": options.transforms.to_dict(), "applied": asdict(instrument.applied)}
    if options.instrument:
        info.update(_breakdown(request, instrument, outcome))
    outcome.info = info
    return outcome


def _breakdown(request: ProbeRequest, instrument: Instrument, outcome: ProbeOutcome) -> dict[str, Any]:
    """The categories at the peak (adding up to it with the residual), the modules and the notes."""
    tracker = instrument.tracker
    assert tracker is not None
    cpu = request.device == "cpu"
    info: dict[str, Any] = {}
    notes = list(instrument.applied.notes)
    flops_note = instrument.count_flops(request.step.precision, "cpu" if cpu else "cuda")
    if flops_note:
        notes.append(flops_note)
    stats = outcome.device_stats
    runtime = 0
    if not cpu and stats:
        runtime = max(0, int(stats.get("max_memory_reserved", 0)) - int(stats.get("max_memory_allocated", 0)))
        nvml = stats.get("nvml_process_bytes")
        if nvml:
            info["outside_budget"] = {"cuda_context": max(0, int(nvml) - int(stats["max_memory_reserved"]))}
    peak = int(outcome.peak_bytes or 0)
    categories, residual = instrument.categories(int(outcome.baseline_bytes or 0), peak, runtime)
    info.update(
        categories=categories,
        residual_bytes=residual,
        tracked_peak_bytes=tracker.peak.tensor_bytes,
        tracked_step_peaks=list(tracker.step_peaks),
        peak_phase=f"step {tracker.peak.step} {tracker.peak.phase}",
        modules=instrument.modules(),
        notes=notes,
    )
    attention = instrument.attention()
    if attention is not None:
        info["attention_scores"] = attention
    return info
