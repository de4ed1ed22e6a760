"""Whether a step's peak is the batch size's alone (autobatch.core.step_peaks), on synthetic step peaks: a leak
grows at every step from the third on; a peak that depends on the data moves by more than the margin."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from autobatch.core.step_peaks import (
    CONFIRM_STEPS_AT_LEAST,
    LEAK_GROWTHS,
    SETTLED_STEP,
    Reading,
    StepRule,
    data_dependence,
    find_leak,
    growth_tolerance,
    lower_peak,
    step_rise,
)

MiB = 1 << 20
BUDGET = 921 * MiB  # 1 GiB less the 10 % headroom
TOLERANCE = growth_tolerance(BUDGET)  # 0.92 MiB: the loop's "still growing"
MARGIN = 3 * MiB  # the CPU margin at this budget


def steady(first: int, second: int, steps: int, wobble: list[int] | None = None) -> list[int]:
    """A step's peaks: the first two steps (the optimizer state appears), then the same peak, plus ``wobble``."""
    peaks = [first, max(first, second)]
    for i in range(steps - 2):
        peaks.append(peaks[-1] + (wobble[i] if wobble else 0))
    return peaks


def leaking(per_step: int, steps: int, start: int = 500 * MiB) -> list[int]:
    return [start + 40 * MiB] + [start + 40 * MiB + 4 * MiB + per_step * i for i in range(steps - 1)]


def test_tolerance_is_the_loops_still_growing() -> None:
    assert growth_tolerance(100 * MiB) == MiB
    assert growth_tolerance(80 << 30) == (80 << 30) // 1000


def test_a_peak_that_grows_at_every_step_is_a_leak_named_by_step_and_growth() -> None:
    # leaks_activations.py at batch 2015 under 1 GiB: 1.97 MiB a step, steps 3-8 of a search probe
    leak = find_leak(leaking(2_065_000, 8), TOLERANCE, batch_size=2015)
    assert leak is not None
    assert (leak.batch_size, leak.first_step, leak.last_step, leak.per_step_bytes) == (2015, 3, 8, 2_065_000)
    text = leak.describe()
    assert "every step from step 3 to step 8 at batch 2015" in text and "1.97 MiB per step" in text


def test_no_leak_when_one_step_held_or_the_probe_was_short_or_the_growth_is_noise() -> None:
    peaks = leaking(5 * MiB, 10)
    peaks[6:] = [p - 5 * MiB for p in peaks[6:]]  # step 7 held
    assert find_leak(peaks, TOLERANCE) is None
    assert find_leak(leaking(5 * MiB, SETTLED_STEP + LEAK_GROWTHS - 2), TOLERANCE) is None  # five steps
    assert find_leak(leaking(5 * MiB, SETTLED_STEP + LEAK_GROWTHS - 1), TOLERANCE) is not None  # six
    assert find_leak(leaking(TOLERANCE, 10), TOLERANCE) is None  # not more than the tolerance


def test_growth_in_the_first_two_steps_is_the_optimizer_state_not_a_leak() -> None:
    peaks = steady(400 * MiB, 480 * MiB, 10)
    assert find_leak(peaks, TOLERANCE) is None and step_rise(peaks, MARGIN) is None


@settings(max_examples=200, deadline=None)
@given(
    first=st.integers(300 * MiB, 900 * MiB),
    state=st.integers(0, 200 * MiB),
    wobble=st.lists(st.integers(0, TOLERANCE), min_size=8, max_size=8),
    steps=st.integers(3, 10),
)
def test_a_steady_step_is_neither_a_leak_nor_data(
    first: int, state: int, wobble: list[int], steps: int
) -> None:
    """Measured on the CPU: from the third step on the examples' peaks grew by 0.0-0.2 MiB."""
    peaks = steady(first, first + state, steps, wobble)
    assert find_leak(peaks, TOLERANCE) is None
    assert step_rise(peaks, MARGIN) is None
    assert data_dependence([Reading(64, "fits", peaks[-1], tuple(peaks))], MARGIN, TOLERANCE) is None


@settings(max_examples=200, deadline=None)
@given(
    per_step=st.integers(TOLERANCE + 1, 500 * MiB),
    steps=st.integers(SETTLED_STEP + LEAK_GROWTHS - 1, 30),
    start=st.integers(100 * MiB, 2000 * MiB),
)
def test_any_growth_above_the_tolerance_at_every_step_is_a_leak(
    per_step: int, steps: int, start: int
) -> None:
    leak = find_leak(leaking(per_step, steps, start), TOLERANCE, batch_size=7)
    assert leak is not None and leak.per_step_bytes == per_step and leak.last_step == steps


def test_a_rise_after_the_optimizer_state_is_named_with_its_step() -> None:
    peaks = steady(400 * MiB, 480 * MiB, 10)
    peaks[6:] = [p + 30 * MiB for p in peaks[6:]]  # step 7 drew a longer sequence
    assert step_rise(peaks, MARGIN) == (7, 30 * MiB)
    assert step_rise(peaks, 30 * MiB) is None  # not more than the margin
    text = data_dependence([Reading(300, "fits", peaks[-1], tuple(peaks))], MARGIN, TOLERANCE) or ""
    assert "at batch 300 step 7 raised the peak by 30.00 MiB" in text
    assert "make_batch must return the worst case" in text


def test_a_leak_is_not_called_data() -> None:
    peaks = leaking(5 * MiB, 10)
    assert data_dependence([Reading(300, "fits", peaks[-1], tuple(peaks))], MARGIN, TOLERANCE) is None


def test_probes_at_one_batch_that_peak_apart_depend_on_the_data() -> None:
    readings = [Reading(326, "fits", 600 * MiB), Reading(326, "fits", 560 * MiB)]
    assert lower_peak(readings, MARGIN) == (readings[0], readings[1])
    near = [Reading(326, "fits", 600 * MiB), Reading(326, "fits", 598 * MiB)]  # within the margin
    assert lower_peak(near, MARGIN) is None


def test_a_larger_batch_that_peaks_lower_depends_on_the_data() -> None:
    readings = [
        Reading(8, "fits", 20 * MiB),
        Reading(690, "fits", 600 * MiB),
        Reading(700, "oom", None),
        Reading(750, "fits", 450 * MiB),
    ]
    assert lower_peak(readings, MARGIN) == (readings[1], readings[3])
    text = data_dependence(readings, MARGIN, TOLERANCE) or ""
    assert "batch 750 peaked 150.00 MiB below batch 690" in text


def test_misses_do_not_count_as_lower_peaks() -> None:
    readings = [Reading(300, "fits", 600 * MiB), Reading(301, "oom", 100 * MiB)]
    assert lower_peak(readings, MARGIN) is None


@settings(max_examples=200, deadline=None)
@given(
    points=st.lists(
        st.tuples(st.integers(1, 5000), st.integers(-MARGIN, MARGIN)),
        min_size=1,
        max_size=12,
        unique_by=lambda p: p[0],
    ),
    slope=st.integers(0, 2 * MiB),
)
def test_peaks_that_rise_with_the_batch_within_the_margin_do_not(
    points: list[tuple[int, int]], slope: int
) -> None:
    """An affine curve with noise of up to half the margin each way never shows a lower peak."""
    readings = [Reading(b, "fits", 300 * MiB + slope * b + noise // 2) for b, noise in points]
    assert lower_peak(readings, MARGIN) is None


def test_batches_of_different_shapes_depend_on_the_data() -> None:
    shaped = Reading(8, "fits", 20 * MiB, (1, 2, 2), ("(8, 162, 80) (8, 162)", "(8, 219, 80) (8, 219)"))
    text = data_dependence([shaped], MARGIN, TOLERANCE) or ""
    assert "make_batch(8) returned batches of different shapes ((8, 162, 80) (8, 162) then (8, 219" in text
    assert data_dependence([Reading(8, "fits", 20 * MiB, (1, 2, 2), ("(8, 3)",))], MARGIN, TOLERANCE) is None


def test_a_script_run_as_it_is_is_told_of_its_batches_not_of_make_batch() -> None:
    shaped = [Reading(8, "fits", 100 * MiB, batch_shapes=("8x32", "8x512"))]
    lenient = data_dependence(shaped, 4 * MiB, 1 * MiB)
    as_is = data_dependence(shaped, 4 * MiB, 1 * MiB, as_is=True)
    assert lenient is not None and "make_batch(8) returned" in lenient
    assert as_is is not None and "make_batch" not in as_is
    assert "at batch 8 the script's batches had different shapes" in as_is
    assert "the script's first batches must be its worst case" in as_is


# examples/text_classifier.py under 420 MiB (budget 378.0 MiB, line 375.0): `autobatch check -b 4 --steps 10`'s
# step peaks (MiB, the fresh-process offset counted). Each step grows under the 1 MiB tolerance, steps 5 and
# 6 peak alike, and the peak creeps on to cross the line at step 8.
CREEP = [360.57, 368.7, 372.15, 373.01, 373.88, 373.88, 374.61, 375.17, 375.17, 375.21]
CREEP_LINE = int(375.0 * MiB)


def test_a_confirmation_whose_creep_would_cross_the_line_steps_on_until_it_does() -> None:
    rule = StepRule.under(int(378.0 * MiB), CONFIRM_STEPS_AT_LEAST, 10, CREEP_LINE)
    peaks = [int(p * MiB) for p in CREEP]
    whys = [rule.why_stop(peaks[:steps]) for steps in range(1, len(peaks) + 1)]
    assert whys[:7] == [None] * 7  # not steady at step 6: the last three growths would cross the line again
    assert whys[7] == "above"


def test_a_peak_that_held_still_far_under_the_line_stops_at_the_least_steps() -> None:
    rule = StepRule.under(int(378.0 * MiB), CONFIRM_STEPS_AT_LEAST, 10, CREEP_LINE + 10 * MiB)
    peaks = [int(p * MiB) for p in CREEP]
    assert rule.why_stop(peaks[:5]) is None
    assert rule.why_stop(peaks[:6]) == "steady"
    # A search probe's three steps stop as before, near the line too: the first steps' growth is the
    # optimizer state's, not a creep.
    search = StepRule.under(int(378.0 * MiB), 3, 8, CREEP_LINE)
    assert search.why_stop([int(p * MiB) for p in (362.0, 374.5, 374.5)]) == "steady"
