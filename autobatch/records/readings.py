"""What the pure core reads from a probe's outcome: an observation, the rising phase's peak, static memory,
the steps' peaks."""

from __future__ import annotations

from collections.abc import Iterable

from autobatch.core.maximum import StaticMemory
from autobatch.core.search import KINDS, Observation
from autobatch.core.step_peaks import Reading
from autobatch.records.protocol import ProbeOutcome


def observation(outcome: ProbeOutcome, state_bytes: int = 0) -> Observation:
    """The search's view of an outcome (a kind the search does not know counts as a crash)."""
    return Observation(
        batch_size=outcome.batch_size,
        fits=outcome.fits,
        # A miss that stopped at the search's line after a whole step: that step's peak (a lower bound of its
        # own, near it). An allocation that failed says only that it got past the cap less that allocation.
        peak_bytes=outcome.peak_bytes if outcome.fits or outcome.stopped_above_bytes is not None else None,
        kind=outcome.kind if outcome.kind in KINDS else "crash",
        samples_per_second=outcome.samples_per_second,
        steps=outcome.steps,
        rising_bytes=rising_peak(outcome, state_bytes),
        static_bytes=static_bytes(outcome),
    )


def static_bytes(outcome: ProbeOutcome) -> int | None:
    """What a fitting probe measured of memory that does not scale with the batch: its process before
    building, the parameters, the gradients and the optimizer state (None: not a fit, or not measured)."""
    if not outcome.fits or outcome.baseline_bytes is None or not outcome.param_bytes:
        return None
    return outcome.baseline_bytes + outcome.param_bytes + outcome.grad_bytes + outcome.optimizer_state_bytes


def rising_peak(outcome: ProbeOutcome, state_bytes: int) -> int | None:
    """The forward and backward phase's peak once the optimizer state is resident: the high-water mark
    when the first backward ended (before any optimizer state existed; the build's own transients
    included, so it errs high at small batches) plus that state, as measured by the probe (a probe that
    failed before measuring it: ``state_bytes``, the analytic figure). None when the probe could not tell.
    """
    first = outcome.first_backward_peak_bytes
    if first is None or outcome.kind not in ("fits", "oom"):
        return None
    return first + (outcome.optimizer_state_bytes or state_bytes)


def measured_static(outcomes: Iterable[ProbeOutcome]) -> StaticMemory | None:
    """The static memory a fitting probe measured (the latest), if any did."""
    measured = [o for o in outcomes if o.fits and o.param_bytes]
    if not measured:
        return None
    o = measured[-1]
    return StaticMemory(o.param_bytes, o.grad_bytes, o.optimizer_state_bytes)


def reading(outcome: ProbeOutcome) -> Reading:
    """What :mod:`autobatch.core.step_peaks` and :mod:`autobatch.core.sanity` read of an outcome: its peak net of the
    probe process's own memory before building (which moves from run to run), its steps' peaks, its batches'
    shapes, its median step time and its forward and backward phase's peak."""
    peak = outcome.peak_bytes
    if peak is not None and outcome.baseline_bytes is not None:
        peak -= outcome.baseline_bytes
    timed = sorted(outcome.step_seconds[1:])
    return Reading(
        outcome.batch_size,
        outcome.kind,
        peak,
        tuple(outcome.step_peaks),
        tuple(outcome.batch_shapes),
        step_seconds=timed[len(timed) // 2] if timed else None,
        phase_bytes=outcome.first_backward_peak_bytes,
    )
