"""Whether the step's peak is the batch size's alone: a leak, and a peak that depends on the data. Pure.

From the third step of a probe on (:data:`SETTLED_STEP`) a step that keeps nothing across steps peaks
where the step before it did. :func:`find_leak` reads growth at every step from there as a leak;
:func:`data_dependence` names batches of different shapes, a step that moved the peak by more than the
margin, or a fit that peaked below a smaller one. The rules and the measurements behind them:
docs/how-a-tune-works.md ("A peak that is the batch's alone").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autobatch.core.units import format_bytes

#: The first step whose peak a steady step does not raise (the optimizer state exists from step 1's step()).
SETTLED_STEP = 3
#: Growths at every step from :data:`SETTLED_STEP` on that name a leak (so a probe of six steps at least).
LEAK_GROWTHS = 4
#: The fewest steps the leak rule reads (the sixth step's growth is its fourth): a confirmation runs them at
#: least, then stops at the first step whose peak holds still (:class:`StepRule`), up to ``confirm_steps``.
CONFIRM_STEPS_AT_LEAST = SETTLED_STEP + LEAK_GROWTHS - 1
#: A still step near the line is steady only if this many more steps growing as the last ones did stay under
#: it (examples/text_classifier.py under 420 MiB: steps 5 and 6 peaked alike, 0.9 MiB under the line, and the
#: peak crept on under the tolerance a step to cross it at step 8).
CREEP_STEPS = 3
#: The least growth tolerance (the step loop's "still growing"), and the budget's share above it.
TOLERANCE_FLOOR = 1 << 20
TOLERANCE_SHARE = 1000


def growth_tolerance(budget_bytes: int) -> int:
    """Growth under which a step's peak holds still: ``max(1 MiB, budget / 1000)`` (the loop stops there)."""
    return max(TOLERANCE_FLOOR, budget_bytes // TOLERANCE_SHARE)


@dataclass(frozen=True)
class StepRule:
    """When a probe stops stepping: after ``min_steps`` at least (and two) once the peak grew by at most
    ``tolerance`` (:func:`growth_tolerance`), after ``max_steps`` at most, or as soon as a peak crosses
    ``stop_above`` (None: never). The one rule of every probe's steps (autobatch's own loop and a script run
    as it is)."""

    min_steps: int
    max_steps: int
    tolerance: int
    stop_above: int | None = None

    @classmethod
    def under(
        cls, budget_bytes: int, min_steps: int, max_steps: int, stop_above: int | None = None
    ) -> StepRule:
        """The rule of a probe under this budget (its tolerance: :func:`growth_tolerance`)."""
        return cls(min_steps, max_steps, growth_tolerance(budget_bytes), stop_above)

    def why_stop(self, step_peaks: Sequence[int]) -> str | None:
        """Why a probe stops stepping after these steps' peaks, or None to keep stepping: ``"above"`` (the
        last peak crossed ``stop_above``, which settles a search's question: a high-water mark only rises),
        ``"steady"`` (at least ``min_steps``, and two, and the peak grew by at most ``tolerance``), ``"max"``."""
        steps = len(step_peaks)
        if steps == 0:
            return None
        if self.stop_above is not None and step_peaks[-1] > self.stop_above:
            return "above"
        if steps >= max(self.min_steps, 2) and step_peaks[-1] - step_peaks[-2] <= self.tolerance:
            if not self._creeps_over(step_peaks):
                return "steady"
        return "max" if steps >= self.max_steps else None

    def _creeps_over(self, step_peaks: Sequence[int]) -> bool:
        """Whether the peak, grown under the tolerance at each step, would cross ``stop_above`` should the next
        :data:`CREEP_STEPS` steps add what the last ones did (growth from :data:`SETTLED_STEP` on only: the
        first steps' is the optimizer state's). Then a still step is no proof: the probe steps on."""
        if self.stop_above is None or len(step_peaks) <= SETTLED_STEP:
            return False
        since = step_peaks[max(SETTLED_STEP - 1, len(step_peaks) - 1 - CREEP_STEPS)]
        return step_peaks[-1] + (step_peaks[-1] - since) > self.stop_above


@dataclass(frozen=True)
class Reading:
    """One probe as these rules read it. ``peak_bytes``: net of the probe process's own memory before the
    model was built; ``batch_shapes``: the distinct shapes of its batches when there were several."""

    batch_size: int
    kind: str
    peak_bytes: int | None
    step_peaks: tuple[int, ...] = ()
    batch_shapes: tuple[str, ...] = ()
    step_seconds: float | None = None  # the median of its timed steps (its first left out; None: not timed)
    phase_bytes: int | None = None  # the forward and backward phase's peak, when the first backward ended


@dataclass(frozen=True)
class Leak:
    """A peak that grew at every step from ``first_step`` to ``last_step`` of a probe at ``batch_size``."""

    batch_size: int
    first_step: int
    last_step: int
    per_step_bytes: int  # the mean growth per step over those steps

    def describe(self) -> str:
        steps = self.last_step - self.first_step + 1
        return (
            f"the step's peak grew at every step from step {self.first_step} to step {self.last_step} at batch "
            f"{self.batch_size}: {format_bytes(self.per_step_bytes)} per step ({format_bytes(self.per_step_bytes * steps)} "
            f"in {steps} steps), after the optimizer state existed: something keeps each step's tensors (a list "
            "that compute_loss appends to?), so the job runs out of memory after enough steps at any batch size"
        )


def _growths(step_peaks: Sequence[int]) -> list[int]:
    """The growth of the peak at each step from :data:`SETTLED_STEP` on."""
    return [step_peaks[i] - step_peaks[i - 1] for i in range(SETTLED_STEP - 1, len(step_peaks))]


def find_leak(step_peaks: Sequence[int], tolerance: int, batch_size: int = 0) -> Leak | None:
    """A leak when the peak grew by more than ``tolerance`` at every step from the third through the last,
    :data:`LEAK_GROWTHS` steps at least (None otherwise)."""
    growths = _growths(step_peaks)
    if len(growths) < LEAK_GROWTHS or min(growths) <= tolerance:
        return None
    last = len(step_peaks)
    return Leak(batch_size, SETTLED_STEP, last, sum(growths) // len(growths))


def step_rise(step_peaks: Sequence[int], threshold: int) -> tuple[int, int] | None:
    """The first step from the third on whose peak rose by more than ``threshold``: (step, rise), or None."""
    for offset, growth in enumerate(_growths(step_peaks)):
        if growth > threshold:
            return SETTLED_STEP + offset, growth
    return None


def lower_peak(readings: Sequence[Reading], threshold: int) -> tuple[Reading, Reading] | None:
    """Two fitting probes (higher, lower) where the lower ran the same batch or a larger one and peaked lower by
    more than ``threshold``: the first such pair in batch order, or None."""
    fits = sorted(
        (r for r in readings if r.kind == "fits" and r.peak_bytes is not None),
        key=lambda r: (r.batch_size, -(r.peak_bytes or 0)),  # at one batch the higher peak first
    )
    highest: Reading | None = None
    for reading in fits:
        peak = reading.peak_bytes or 0
        if highest is not None and peak < (highest.peak_bytes or 0) - threshold:
            return highest, reading
        if highest is None or peak > (highest.peak_bytes or 0):
            highest = reading
    return None


def data_dependence(
    readings: Sequence[Reading], threshold: int, tolerance: int, as_is: bool = False
) -> str | None:
    """What shows that one combination's peak depends on the data (see the module docstring), or None.
    ``as_is``: the script runs as it is, and its own loader draws the batches (no ``make_batch`` to name)."""
    evidence: list[str] = []
    shaped = next((r for r in readings if len(r.batch_shapes) > 1), None)
    if shaped is not None:
        who = (
            f"at batch {shaped.batch_size} the script's batches had"
            if as_is
            else (f"make_batch({shaped.batch_size}) returned batches of")
        )
        evidence.append(f"{who} different shapes ({' then '.join(shaped.batch_shapes)})")
    for r in readings:
        rise = step_rise(r.step_peaks, threshold)
        if rise is not None and find_leak(r.step_peaks, tolerance) is None:
            evidence.append(
                f"at batch {r.batch_size} step {rise[0]} raised the peak by {format_bytes(rise[1])} (more than the "
                f"{format_bytes(threshold)} margin) although the optimizer state already existed"
            )
            break
    pair = lower_peak(readings, threshold)
    if pair is not None:
        high, low = pair
        assert high.peak_bytes is not None and low.peak_bytes is not None
        evidence.append(
            f"batch {low.batch_size} peaked {format_bytes(high.peak_bytes - low.peak_bytes)} below batch "
            f"{high.batch_size} (more than the {format_bytes(threshold)} margin)"
        )
    if not evidence:
        return None
    fix = (
        "the script's first batches must be its worst case (sort its data longest first, or pad every batch to "
        "the longest sequence, the largest image the job sees)"
        if as_is
        else "make_batch must return the worst case (the longest sequence, the largest image) at every call"
    )
    return (
        f"the peak depends on the data: {'; '.join(evidence)}. The maximum holds for the batches the probes "
        f"drew, not for every batch of the job: {fix}"
    )
