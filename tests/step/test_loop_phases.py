"""The step loop reads the peak between the first backward and the first optimizer step, and the tuner
turns it into the rising phase's peak."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import ModuleType

import torch

from autobatch.core.step_peaks import StepRule
from autobatch.records.protocol import ProbeOutcome
from autobatch.records.readings import observation, rising_peak
from autobatch.step.contract import UserScript
from autobatch.step.loop import StepConfig, StepReport, run_steps


def _linear(width: int) -> UserScript:
    """A script of one Linear layer of ``width`` features, whose loss is the sum of its outputs."""
    return UserScript(
        Path(f"<linear {width}>"),
        ModuleType("linear"),
        lambda: torch.nn.Linear(width, width),
        lambda batch_size: torch.randn(batch_size, width),
        lambda model, batch: model(batch).sum(),
    )


def test_the_first_backward_is_read_before_the_optimizer_state_exists() -> None:
    script = _linear(8)
    reads = itertools.count(100)
    states: list[int] = []
    report = StepReport()

    def peak_now() -> int:
        states.append(sum(len(s) for s in optimizer_states))
        return next(reads)

    optimizer_states: list[dict[str, object]] = []
    original = torch.optim.AdamW.step

    def step(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        optimizer_states[:] = list(self.state.values())
        return original(self, *args, **kwargs)

    torch.optim.AdamW.step = step  # type: ignore[method-assign]
    try:
        run_steps(
            script,
            StepConfig(4, "32-true", "adamw"),
            report,
            StepRule(3, 3, 0),
            peak_now=peak_now,
            synchronize=lambda: None,
        )
    finally:
        torch.optim.AdamW.step = original  # type: ignore[method-assign]
    assert report.first_backward_peak == 100  # the first read, taken before any optimizer step
    assert states[0] == 0  # no optimizer state existed then
    assert report.step_peaks == [101, 102, 103]


def test_rising_peak_adds_the_optimizer_state_and_keeps_misses() -> None:
    fit = ProbeOutcome(kind="fits", steps=3, first_backward_peak_bytes=500, optimizer_state_bytes=200)
    assert rising_peak(fit, 150) == 700  # the state the probe measured
    miss = ProbeOutcome(kind="oom", steps=1, first_backward_peak_bytes=900)
    assert rising_peak(miss, 150) == 1050  # failed before measuring it: the analytic figure
    assert rising_peak(ProbeOutcome(kind="oom"), 150) is None  # out of memory before the first backward ended
    assert rising_peak(ProbeOutcome(kind="crash", first_backward_peak_bytes=1), 150) is None


def test_a_miss_keeps_the_peak_it_reached_for_the_search() -> None:
    """A probe that stopped at the step whose peak crossed its line reports that step's peak, a point for the
    search; one whose allocation failed reports none: how high it got before is no measure of its peak (the
    root tune's fourth combination crept 44, 43, 42, 41, 40 down on such readings), nor is a crash's."""
    stopped = ProbeOutcome(
        kind="oom",
        batch_size=315,
        steps=2,
        peak_bytes=919,
        first_backward_peak_bytes=900,
        stopped_above_bytes=918,
    )
    seen = observation(stopped, state_bytes=4)
    assert (seen.fits, seen.peak_bytes, seen.rising_bytes) == (False, 919, 904)
    failed = ProbeOutcome(kind="oom", batch_size=316, steps=1, peak_bytes=917, first_backward_peak_bytes=901)
    assert (
        observation(failed, state_bytes=4).peak_bytes,
        observation(failed, state_bytes=4).rising_bytes,
    ) == (
        None,
        905,
    )
    crashed = ProbeOutcome(kind="crash", batch_size=315, steps=0, peak_bytes=700)
    assert observation(crashed).peak_bytes is None


def test_a_fit_reports_the_static_memory_it_measured() -> None:
    """Its own baseline, parameters, gradients and optimizer state: what the guess after the first fit
    scales the rest over (a miss reports none; nor does a fit that measured no parameters)."""
    fit = ProbeOutcome(
        kind="fits",
        batch_size=8,
        steps=3,
        peak_bytes=880,
        baseline_bytes=298,
        param_bytes=96,
        grad_bytes=96,
        optimizer_state_bytes=192,
    )
    assert observation(fit).static_bytes == 682
    miss = ProbeOutcome(kind="oom", batch_size=9, steps=1, baseline_bytes=298, param_bytes=96)
    assert observation(miss).static_bytes is None
    assert observation(ProbeOutcome(kind="fits", batch_size=8, steps=3, peak_bytes=1)).static_bytes is None


def test_each_step_times_its_update_apart_inside_the_step() -> None:
    # A model whose parameters are many and whose forward is one element: the update (AdamW over a million
    # values) is most of the step, and it is timed inside it.
    script = _linear(1024)
    report = StepReport()
    config = StepConfig(1, "32-true", "adamw")
    run_steps(script, config, report, StepRule(3, 3, 0), peak_now=lambda: 0, synchronize=lambda: None)
    assert len(report.update_seconds) == len(report.step_seconds) == 3
    assert all(0 < u < s for u, s in zip(report.update_seconds, report.step_seconds))
