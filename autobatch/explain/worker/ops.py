"""The ``explain`` and ``estimate`` operations, registered with the probe layer, run in a forked probe process.

The probe server imports this module at start-up when the parent names it in ``op_modules``
(:data:`autobatch.explain.pure.options.OP_MODULES`). :func:`explain_operation` is one probe of the real
step, instrumented (its breakdown in the outcome's ``info``); :func:`estimate_operation` runs no real step,
only fake-tensor simulations of each scenario searched for their maximum, at the request's sequence length.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

from autobatch.core.units import format_bytes
from autobatch.explain.pure.maxima import (
    Offset,
    ScenarioEstimate,
    SimResult,
    SimulationError,
    Simulator,
    calibrated_offset,
    estimate_scenario,
)
from autobatch.explain.pure.options import ESTIMATE, EXPLAIN, EstimateOptions, ExplainOptions, NamedScenario
from autobatch.explain.pure.records import Scenario
from autobatch.explain.worker.instrumented import explain_step, warm_up
from autobatch.explain.worker.ranks import LEAVES_OUT, rank_of
from autobatch.explain.worker.simulate import simulate
from autobatch.probe.ops import register
from autobatch.records.protocol import ProbeOutcome, ProbeRequest
from autobatch.step.contract import UserScript


@register(EXPLAIN, ExplainOptions)
def explain_operation(request: ProbeRequest, script: UserScript, options: ExplainOptions) -> ProbeOutcome:
    """One probe of the real step, with the options' transforms, instrumented unless they say not
    (with a distributed strategy, on every rank: :mod:`autobatch.explain.worker.distributed`).

    The worker's own probe, so budget, steps, OOM classification and peak are exactly a probe's; without
    instrumentation it is a plain probe with the levers' model changes.
    """
    if request.strategy != "none":
        from autobatch.explain.worker.distributed import explain_on_ranks

        return explain_on_ranks(request, script, options)
    return explain_step(request, script, options)


@register(ESTIMATE, EstimateOptions)
def estimate_operation(request: ProbeRequest, script: UserScript, options: EstimateOptions) -> ProbeOutcome:
    """Every scenario's predicted maximum, from simulations (each batch size simulated once).

    One operation per sequence length. Its outcome's ``info`` holds ``target``, ``offset``, the ``scenarios``'
    estimates, and ``simulated`` or ``baseline_bytes`` as the offset was found.
    """

    @functools.cache
    def sim(scenario: Scenario, batch_size: int) -> SimResult:
        # the request's step, with the optimizer arguments of the scenario's optimizer (simulate replaces the rest)
        step = replace(
            request.step, optimizer_kwargs=dict(options.optimizer_kwargs.get(scenario.optimizer) or {})
        )
        return simulate(
            script,
            scenario,
            batch_size,
            target=options.target,
            step=step,
            rank=rank_of(options.strategy, options.world_size, script, step.recompute_classes),
        )

    info: dict[str, Any] = {"target": options.target}
    if options.strategy != "none":
        info["strategy"] = {
            "strategy": options.strategy,
            "world_size": options.world_size,
            "leaves_out": LEAVES_OUT,
        }
    offset = _offset(options, sim, info)
    info["offset"] = offset.to_dict()
    info["scenarios"] = [_estimate(named, sim, offset, options).to_dict() for named in options.scenarios]
    return ProbeOutcome(kind="fits", info=info)


def _offset(options: EstimateOptions, sim: Simulator, info: dict[str, Any]) -> Offset:
    """What the simulations do not see (see :class:`EstimateOptions`); notes how it was found in ``info``."""
    if options.calibrate is not None:
        batch = max(options.calibrate.points)[0]
        result = sim(options.calibrate.scenario, batch)
        if not result.ok:
            raise SimulationError(f"simulating the measured step under fake tensors failed: {result.error}")
        info["simulated"] = {str(batch): result.device_peak}
        return calibrated_offset(list(options.calibrate.points), {batch: result.device_peak})
    if options.offset is not None:
        return options.offset
    from autobatch.devices import cpu

    scenarios = [named.scenario for named in options.scenarios]
    warm_up({s.precision for s in scenarios}, {s.optimizer for s in scenarios}, options.optimizer_kwargs)
    baseline = cpu.read_status().data
    info["baseline_bytes"] = baseline
    runtime = options.cpu_runtime_bytes
    how = f"baseline VmData {format_bytes(baseline)} + runtime buffers {format_bytes(runtime)}"
    return Offset(baseline + runtime, 0.0, how)


def _estimate(
    named: NamedScenario, sim: Simulator, offset: Offset, options: EstimateOptions
) -> ScenarioEstimate:
    """One scenario's search; calibrated on its own measured step when it has one (its kernels, its
    library buffers), on the common offset otherwise."""
    if named.points:
        batch = max(named.points)[0]
        result = sim(named.scenario, batch)
        if result.ok:
            offset = calibrated_offset(list(named.points), {batch: result.device_peak})
    return estimate_scenario(
        named.name,
        named.scenario,
        sim,
        offset=offset,
        budget_bytes=options.budget_bytes,
        max_batch_size=options.max_batch_size,
        batch_multiple=options.batch_multiple,
        report_at=options.report_at,
    )
