"""The ``explain`` and ``estimate`` operations, run inside a forked probe process by the worker.

``op="explain"``: one probe of the real step (the worker's own probe, so budget, steps, OOM
classification and peak are exactly a probe's), instrumented by :class:`Instrument` unless
``options["instrument"]`` is false (then it is a plain probe with the levers' model changes in
``options["transforms"]``). Its outcome carries the breakdown in ``info``.

``op="estimate"``: no real step; fake-tensor simulations of each scenario in ``options["scenarios"]``,
searched for their maximum (:mod:`autobatch.explain.estimate`). Options: ``target`` ("cpu" | "cuda"),
``budget_bytes``, ``max_batch_size``, ``batch_multiple``, ``optimizer_kwargs`` (per optimizer),
``offset`` ({intercept, slope}) or ``calibrate`` ({scenario, points: [[batch, measured bytes], ...]})
or, on the CPU, ``cpu_runtime_bytes`` added to the baseline this process measures; ``report_at``
(batch sizes to report predictions at). A scenario may carry its own ``points``: it is then
calibrated on its own measured step instead.
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from typing import Any

from ..contract import UserScript
from ..errors import AutobatchError
from ..probe.protocol import ProbeOutcome, ProbeRequest
from .breakdown import Instrument
from .estimate import CPU_RUNTIME_BYTES, Offset, calibrated_offset, estimate_scenario
from .records import Scenario, Transforms
from .simulate import SimResult, simulate
from .tracker import MemoryTracker
from .transforms import applied_during_step


def run_op(request: ProbeRequest, script: UserScript) -> ProbeOutcome:
    """Dispatch ``explain`` / ``estimate``; errors of autobatch's own become an ``error`` outcome."""
    try:
        if request.op == "explain":
            return run_explain(request, script)
        return run_estimate(request, script)
    except AutobatchError as exc:
        from ..errors import ContractError

        return ProbeOutcome(
            kind="error",
            batch_size=request.batch_size,
            error_type=type(exc).__name__,
            error_message=exc.message + (f"\nhint: {exc.hint}" if exc.hint else ""),
            contract=isinstance(exc, ContractError),
        )


def warm_up(precisions: set[str], optimizers: set[str], optimizer_kwargs: dict[str, Any]) -> None:
    """A tiny real step per optimizer and precision: loads what torch imports lazily (about 70 MiB of
    data memory on a first optimizer), so that a baseline read afterwards includes it."""
    import torch

    from ..step.loop import autocast_for
    from ..step.optimizers import build_optimizer

    torch.ones(64, 64) @ torch.ones(64, 64)
    for optimizer in sorted(optimizers):
        for precision in sorted(precisions):
            layer = torch.nn.Linear(4, 4)
            try:
                opt = build_optimizer(optimizer, list(layer.parameters()), optimizer_kwargs.get(optimizer))
                with autocast_for(precision, "cpu"):
                    loss = layer(torch.ones(2, 4)).float().sum()
                loss.backward()
                opt.step()
            except Exception:  # noqa: BLE001 - a warm-up failure shows up in the real step, if at all
                pass


def run_explain(request: ProbeRequest, script: UserScript) -> ProbeOutcome:
    from ..probe import worker

    options = request.options
    transforms = Transforms.from_dict(options.get("transforms"))
    track = bool(options.get("instrument", True))
    cpu = request.device == "cpu"
    if cpu:
        warm_up({request.precision}, {request.optimizer}, {request.optimizer: request.optimizer_kwargs})
    instrument = Instrument(transforms, MemoryTracker() if track else None)
    wrapped = instrument.wrap(script)
    start = time.perf_counter()
    with applied_during_step(transforms, instrument.applied), instrument:
        outcome = worker.measure_steps(replace(request, op="probe"), wrapped, start)
    info: dict[str, Any] = {"transforms": transforms.to_dict(), "applied": asdict(instrument.applied)}
    if track:
        notes = list(instrument.applied.notes)
        flops_note = instrument.count_flops(request.precision, "cpu" if cpu else "cuda")
        if flops_note:
            notes.append(flops_note)
        stats = outcome.device_stats
        runtime = 0
        if not cpu and stats:
            runtime = max(
                0, int(stats.get("max_memory_reserved", 0)) - int(stats.get("max_memory_allocated", 0))
            )
            nvml = stats.get("nvml_process_bytes")
            if nvml:
                info["outside_budget"] = {
                    "cuda_context": max(0, int(nvml) - int(stats["max_memory_reserved"]))
                }
        peak = int(outcome.peak_bytes or 0)
        categories, residual = instrument.categories(int(outcome.baseline_bytes or 0), peak, runtime)
        tracker = instrument.tracker
        assert tracker is not None
        info.update(
            categories=categories,
            residual_bytes=residual,
            tracked_peak_bytes=tracker.peak.tensor_bytes,
            tracked_step_peaks=list(tracker.step_peaks),
            peak_phase=f"step {tracker.peak.step} {tracker.peak.phase}",
            modules=instrument.modules(),
            notes=notes,
        )
    outcome.info = info
    return outcome


def run_estimate(request: ProbeRequest, script: UserScript) -> ProbeOutcome:
    options = request.options
    target = str(options.get("target", "cpu"))
    kwargs: dict[str, dict[str, Any]] = {k: dict(v) for k, v in options.get("optimizer_kwargs", {}).items()}
    raw = list(options.get("scenarios", []))
    scenarios = [(str(s.get("name", "")), Scenario.from_dict(s)) for s in raw]
    own_points = [[(int(b), int(m)) for b, m in s.get("points", [])] for s in raw]
    classes = tuple(request.recompute_classes) or script.recompute_classes
    runs: dict[tuple[Scenario, int], SimResult] = {}

    def sim(scenario: Scenario, batch_size: int) -> SimResult:
        key = (scenario, batch_size)
        if key not in runs:
            runs[key] = simulate(
                script,
                scenario,
                batch_size,
                target=target,
                optimizer_kwargs=kwargs.get(scenario.optimizer),
                recompute_classes=classes,
            )
        return runs[key]

    info: dict[str, Any] = {"target": target}
    if "calibrate" in options:
        base = Scenario.from_dict(options["calibrate"]["scenario"])
        points = [(int(b), int(m)) for b, m in options["calibrate"]["points"]]
        simulated = {}
        for b, _ in [max(points)]:
            result = sim(base, b)
            if not result.ok:
                return _failed(request, result, "simulating the measured step")
            simulated[b] = result.device_peak
        offset = calibrated_offset(points, simulated)
        info["simulated"] = {str(b): v for b, v in simulated.items()}
    elif "offset" in options:
        offset = Offset.from_dict(options["offset"])
    else:
        from ..devices import cpu

        warm_up({s.precision for _, s in scenarios}, {s.optimizer for _, s in scenarios}, kwargs)
        baseline = cpu.read_status().data
        info["baseline_bytes"] = baseline
        runtime = int(options.get("cpu_runtime_bytes", CPU_RUNTIME_BYTES))
        offset = Offset(
            baseline + runtime, 0.0, f"baseline VmData {baseline} B + runtime buffers {runtime} B"
        )
    info["offset"] = offset.to_dict()
    estimates = []
    for (name, scenario), points in zip(scenarios, own_points):
        own = offset
        if points:  # calibrated on this scenario's own measured step (its kernels, its library buffers)
            result = sim(scenario, max(points)[0])
            if result.ok:
                own = calibrated_offset(points, {max(points)[0]: result.device_peak})
        estimates.append(
            estimate_scenario(
                name,
                scenario,
                sim,
                offset=own,
                budget_bytes=int(options["budget_bytes"]),
                max_batch_size=int(options.get("max_batch_size", 65536)),
                batch_multiple=int(options.get("batch_multiple", 1)),
                report_at=tuple(int(b) for b in options.get("report_at", ())),
            ).to_dict()
        )
    info["scenarios"] = estimates
    return ProbeOutcome(kind="fits", info=info)


def _failed(request: ProbeRequest, result: SimResult, what: str) -> ProbeOutcome:
    return ProbeOutcome(
        kind="error",
        batch_size=result.batch_size,
        error_type="SimulationError",
        error_message=f"{what} under fake tensors failed: {result.error}",
    )
