"""The built-in operations of a forked probe process: ``probe`` and ``inspect``.

``probe`` applies the budget, runs the steps, measures and reports; ``inspect`` builds the model once
and reports what the runner plans the search with. Both are registered with :mod:`autobatch.probe.ops`
like any other operation, and everything they find is returned as a :class:`ProbeOutcome` record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from autobatch.core.step_peaks import StepRule
from autobatch.core.units import format_bytes
from autobatch.devices.backend import backend_for
from autobatch.devices.budget import margin_reason
from autobatch.errors import AutobatchError
from autobatch.probe import progress
from autobatch.probe.compile_errors import note_compile_failure
from autobatch.probe.oom import classify_exception
from autobatch.probe.ops import register
from autobatch.records.failures import describe_failure
from autobatch.records.protocol import ProbeOutcome, ProbeRequest
from autobatch.step.contract import UserScript, check_model

if TYPE_CHECKING:
    from autobatch.step.loop import StepReport, Wrap

PRECISION_CHECKS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true")


@register("probe")
def run_probe(request: ProbeRequest, script: UserScript) -> ProbeOutcome:
    """One probe: the steps of the request's combination and batch size, under its budget
    (a distributed strategy runs them on every rank: :mod:`autobatch.probe.ranks`)."""
    if request.strategy != "none":
        from autobatch.probe.ranks import run_ranks

        # no rank stops at the search's line on its own: the others would wait for it in a collective
        return run_ranks(replace(request, stop_above_bytes=None), script, measure_steps)
    return measure_steps(request, script, time.perf_counter())


def measure_steps(
    request: ProbeRequest, script: UserScript, start: float, *, wrap: Wrap | None = None
) -> ProbeOutcome:
    """Apply the budget, run the steps, measure: the probe proper (explain wraps the script first;
    ``wrap``: a distributed strategy's model wrapper, on one rank)."""
    from autobatch.step.loop import StepReport, run_steps

    outcome = ProbeOutcome(kind="fits", batch_size=request.batch_size, budget_bytes=request.budget_bytes)
    report = StepReport()
    device = backend_for(request.device)
    device.apply(request, outcome)
    peak_now = progress.reporting(device.peak, request, report)
    outcome.setup_seconds = time.perf_counter() - start
    load = device.load_meter()
    try:
        run_steps(
            script,
            request.step,
            report,
            StepRule.under(
                request.budget_bytes, request.min_steps, request.max_steps, request.stop_above_bytes
            ),
            peak_now=peak_now,
            synchronize=device.synchronize,
            wrap=wrap,
            batch_per_step=request.op == "probe",  # explain's breakdown tags the one batch it saw built
        )
    except AutobatchError as exc:
        describe_failure(outcome, exc)
    except BaseException as exc:  # noqa: BLE001 - everything the script raises becomes data
        used = _safe(peak_now)
        kind = classify_exception(exc, used_bytes=used, budget_bytes=request.budget_bytes)
        describe_failure(outcome, exc, kind=kind)
        if kind == "error" and request.step.compile:
            note_compile_failure(outcome, exc)  # "does not compile" is an answer, not the script's error
    finally:
        outcome.peak_bytes = _safe(peak_now)
        outcome.cpu_wait = load()
    device.finish(outcome)
    if outcome.fits and report.stopped_above:
        _stopped_at_line(outcome, report.steps, request)
    _read_report(outcome, report)
    return outcome


def _read_report(outcome: ProbeOutcome, report: StepReport) -> None:
    """What the steps measured, into the outcome (and the throughput of a fit's timed steps)."""
    outcome.steps = report.steps
    outcome.step_peaks = report.step_peaks
    outcome.step_seconds = report.step_seconds
    outcome.update_seconds = report.update_seconds
    outcome.param_count = report.param_count
    outcome.param_bytes = report.param_bytes
    outcome.grad_bytes = report.grad_bytes
    outcome.optimizer_state_bytes = report.optimizer_state_bytes
    outcome.first_backward_peak_bytes = report.first_backward_peak
    outcome.recompute_blocks = list(report.recompute_blocks)
    outcome.batch_shapes = list(report.batch_shapes)
    outcome.compile_seconds = report.compile_seconds
    timed = report.step_seconds[1:]  # the first step warms up (and compiles: step_seconds leave that out)
    if outcome.kind == "fits" and timed and sum(timed) > 0:
        outcome.samples_per_second = outcome.batch_size * len(timed) / sum(timed)


def _stopped_at_line(outcome: ProbeOutcome, steps: int, request: ProbeRequest) -> None:
    """The peak crossed the search's line (budget less the margin) at step ``steps``: the probe does not
    fit under the margin rule whatever the later steps would have done, as a high-water mark only rises."""
    assert request.stop_above_bytes is not None
    outcome.kind = "oom"
    outcome.stopped_above_bytes = request.stop_above_bytes
    outcome.reason = margin_reason(
        request.budget_bytes - request.stop_above_bytes,
        outcome.peak_bytes,
        request.budget_bytes,
        f"crossed {format_bytes(request.stop_above_bytes)} at step {steps} of at most {request.max_steps} and "
        "stopped there (later steps only add to a peak)",
    )


@register("inspect")
def inspect_model(request: ProbeRequest, script: UserScript) -> ProbeOutcome:
    """Build the model once (no budget) and report what the runner needs to plan the search."""
    from autobatch.step.recompute import count_blocks, detect_blocks

    outcome = ProbeOutcome(kind="fits")
    info: dict[str, Any] = {}
    model = check_model(script.build_model())
    info["param_shapes"] = [list(p.shape) for p in model.parameters() if p.requires_grad]
    info["param_count"] = sum(p.numel() for p in model.parameters())
    info["recompute_blocks"] = list(
        request.step.recompute_classes or script.recompute_classes or detect_blocks(model)
    )
    info["recompute_counts"] = count_blocks(model, tuple(info["recompute_blocks"]))  # "Block x 12"
    blocks = set(info["recompute_blocks"])  # each block's parameters: what FSDP all-gathers at once
    info["block_params"] = [
        sum(p.numel() for p in m.parameters()) for m in model.modules() if type(m).__name__ in blocks
    ]
    del model
    info.update(backend_for(request.device).facts(PRECISION_CHECKS))
    outcome.info = info
    return outcome


def _safe(fn: Callable[[], int]) -> int | None:
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return None
