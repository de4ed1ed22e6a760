"""The built-in operations of a forked probe process: ``probe`` and ``inspect``.

``probe`` applies the budget, runs the steps, measures and reports; ``inspect`` builds the model once
and reports what the runner plans the search with. Both are registered with :mod:`autobatch.probe.ops`
like any other operation, and everything they find is returned as a :class:`ProbeOutcome` record.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

from autobatch.core.step_peaks import StepRule
from autobatch.core.units import format_bytes
from autobatch.devices.budget import margin_reason
from autobatch.devices.cuda.budget import CudaStepStats, judge_step
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
    outcome.omp_wait_policy = os.environ.get("OMP_WAIT_POLICY")
    report = StepReport()
    peak_now, synchronize, finish = _device_hooks(request, outcome)
    peak_now = progress.reporting(peak_now, request, report)
    outcome.setup_seconds = time.perf_counter() - start
    load = _load_meter(request)
    try:
        run_steps(
            script,
            request.step,
            report,
            StepRule.under(
                request.budget_bytes, request.min_steps, request.max_steps, request.stop_above_bytes
            ),
            peak_now=peak_now,
            synchronize=synchronize,
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
    finish(outcome)
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


def _load_meter(request: ProbeRequest) -> Callable[[], float | None]:
    """On the CPU device, a reading of how long the probe's threads waited for a core since now, over the
    wall time (a timing none of whose threads waited measures the step's own cost); elsewhere, nothing."""
    if request.device != "cpu":
        return lambda: None
    from autobatch.devices import cpu

    start = cpu.read_run_wait()
    return lambda: cpu.waiting_share(start, cpu.read_run_wait())


def _device_hooks(
    request: ProbeRequest, outcome: ProbeOutcome
) -> tuple[Callable[[], int], Callable[[], None], Callable[[ProbeOutcome], None]]:
    """Apply the budget for this device; return (peak so far, synchronize, finish)."""
    import torch

    if request.device == "cpu":
        from autobatch.devices import cpu

        # Counted as the job's fresh process would count it (autobatch.probe.fresh): this forked process holds
        # ``offset`` less than that one at the same step, so its cap is that much lower and its readings higher.
        offset = request.offset_for()
        # A timing probe measures the step as the job's allocator runs it; its cap leaves room for that heap.
        outcome.job_allocator = request.timing and not request.pinned_allocator and cpu.job_allocator()
        cpu.apply_cap(request.budget_bytes - offset + (cpu.TIMING_ROOM if outcome.job_allocator else 0))
        # torch's thread pool is left to start in the first step, as the job's does: started ahead of it (a small
        # product), a process holds 10-30 MiB less after a step than one whose first parallel work is the step
        vm0 = cpu.read_status()
        outcome.baseline_bytes = vm0.data + offset
        peak = lambda: cpu.peak_data_bytes(vm0, cpu.read_status()) + offset  # noqa: E731
        return peak, (lambda: None), (lambda _o: None)

    from autobatch.devices.cuda import runtime
    from autobatch.devices.cuda.nvml import open_nvml

    index = torch.device(request.device).index or 0
    torch.cuda.set_device(index)
    runtime.apply_budget_bytes(request.budget_bytes, index)
    runtime.reset_peaks(index)
    outcome.baseline_bytes = int(torch.cuda.memory_reserved(index))

    def finish(o: ProbeOutcome) -> None:
        with open_nvml(*runtime.device_ids(index)) as nvml:  # no NVML: no process figure
            stats = runtime.read_step_stats(index, nvml)
        o.device_stats = stats.to_dict()
        o.kind, o.reason = cuda_verdict(o, stats, request)

    return (
        (lambda: int(torch.cuda.max_memory_reserved(index))),
        (lambda: runtime.synchronize(index)),
        finish,
    )


def cuda_verdict(
    outcome: ProbeOutcome, stats: CudaStepStats, request: ProbeRequest
) -> tuple[str, str | None]:
    """A CUDA probe's kind and reason after judging its stats: a fit that was too tight is an OOM.

    Judged against the request's budget and, where both are known, NVML's figure for the process
    against the request's per-process limit.
    """
    if outcome.kind != "fits":
        return outcome.kind, outcome.reason
    fits, reason = judge_step(stats, request.budget_bytes, request.process_limit_bytes)
    return ("fits", outcome.reason) if fits else ("oom", reason)


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
    info.update(device_facts(request.device, precisions=PRECISION_CHECKS))
    outcome.info = info
    return outcome


def device_facts(device_name: str, *, precisions: tuple[str, ...] = ()) -> dict[str, Any]:
    """What an inspection reports of the device: on CUDA its snapshot, on the CPU the memory there is and
    the baseline a probe starts from; the ``precisions`` it cannot run (``unsupported_precisions``)."""
    import torch

    from autobatch.step.loop import tiny_step

    info: dict[str, Any] = {}
    device = torch.device(device_name)
    unsupported: dict[str, str] = {}
    if device.type == "cuda":
        from autobatch.devices.cuda import runtime

        index = device.index or 0
        info["snapshot"] = runtime.snapshot_dict(index)
        unsupported.update({k: v for k, v in runtime.capabilities(index).items() if v})
    else:
        from autobatch.devices import cpu

        info["cuda_available"] = bool(torch.cuda.is_available())
        info["available_bytes"] = cpu.available_bytes()
        info["total_bytes"] = cpu.total_bytes()
        info["baseline_bytes"] = cpu.read_status().data
        for precision in precisions:
            try:
                tiny_step(precision)
            except Exception as exc:  # noqa: BLE001
                unsupported[precision] = f"{type(exc).__name__}: {exc}"
    info["unsupported_precisions"] = unsupported
    return info


def _safe(fn: Callable[[], int]) -> int | None:
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return None
