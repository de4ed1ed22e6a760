"""The search's end game near the boundary, over curves measured on the CPU (no torch): once a non-fit
bounds the bracket, the maximum and the candidate above it, not a creep one sample a probe."""

from __future__ import annotations

import bisect

from autobatch.core import endgame
from autobatch.core.search import Guidance, Observation, search_max_batch

MiB = 2**20


def _peak(points: list[tuple[int, float]], b: int) -> int:
    """The measured peaks (MiB), joined by straight lines: bytes at batch b."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    i = min(max(bisect.bisect_left(xs, b), 1), len(xs) - 1)
    if xs[i] == b:
        return int(ys[i] * MiB)
    (x0, y0), (x1, y1) = (xs[i - 1], ys[i - 1]), (xs[i], ys[i])
    return int((y0 + (y1 - y0) * (b - x0) / (x1 - x0)) * MiB)


#: ``tests/scripts/quadratic.py`` under 471 MiB, headroom 0.1, 32-true/adamw (2026-11-28): the peaks each
#: probe measured (MiB); the line is 420.90 MiB (the budget less the 3 MiB CPU margin). Convex near the
#: boundary: 0.065 MiB a sample from 2670 to 2825, 0.069 from 2825 to 2966, 0.068 from 2966 to 2972.
QUADRATIC = [
    (8, 299.81),
    (238, 313.59),
    (2028, 365.00),
    (2670, 401.06),
    (2825, 411.20),
    (2966, 420.88),
    (2967, 420.94),
    (2968, 421.02),
    (2972, 421.29),
    (3312, 443.0),
]
QUADRATIC_LINE = int(420.90 * MiB)


def _quadratic_probe(calls: list[int]) -> tuple[object, object]:
    def probe(b: int, steps: int = 3) -> Observation:
        calls.append(b)
        peak = _peak(QUADRATIC, b)
        if b >= 3312:  # an allocation failed: no peak
            return Observation(b, False, kind="oom", steps=1)
        if peak > QUADRATIC_LINE:  # stopped at the step that crossed the line
            return Observation(b, False, kind="oom", peak_bytes=peak, steps=2)
        return Observation(b, True, peak_bytes=peak, steps=steps)

    return probe, lambda b: probe(b, 6)


def test_a_convex_curve_s_bend_is_not_read_as_noise_next_to_the_boundary() -> None:
    """The quadratic example, measured: after the fits at 2670 and 2825 and the miss at 2972 (its peak
    0.39 MiB over the line), 2966 fitted as the predicted maximum (6 steps). The least-squares line through
    the points near the boundary read the curve's bend as 2.6 samples of noise, so the end game probed 2968
    and then 2967 (both out of memory by less than the margin) before the answer held. The parabola through
    them leaves 0.09 samples: the candidate above the fit is the one to probe, and the search ends there."""
    calls: list[int] = []
    probe, final = _quadratic_probe(calls)
    known = [probe(b) for b in (8, 238, 2028, 3312, 2670, 2825, 2972)] + [final(2966)]
    calls.clear()
    result = search_max_batch(
        probe, budget_bytes=QUADRATIC_LINE, max_batch_size=65536, known=known,
        guidance=Guidance(final_probe=final, long_steps=6),
    )  # fmt: skip
    assert result.max_batch_size == 2966 and result.status == "exact"
    assert calls == [2967], calls


def test_the_quadratic_example_s_end_game_takes_three_probes_after_its_overshoot() -> None:
    """From the same tune's fits at 2670 and 2825 (after 3312 ran out of memory): a miss over the line, the
    maximum as long as a confirmation and the candidate above it (four before: 2968 as well)."""
    calls: list[int] = []
    probe, final = _quadratic_probe(calls)
    known = [probe(b) for b in (8, 238, 2028, 3312, 2670, 2825)]
    calls.clear()
    result = search_max_batch(
        probe, budget_bytes=QUADRATIC_LINE, max_batch_size=65536, known=known,
        guidance=Guidance(final_probe=final, long_steps=6),
    )  # fmt: skip
    assert result.max_batch_size == 2966 and result.status == "exact"
    assert len(calls) <= 3 and calls[-2:] == [2966, 2967], calls


def test_noise_on_a_straight_line_is_still_read_with_four_points() -> None:
    """The parabola takes the bend out, not the noise: four points off a straight line by a sample each
    way still read about that much."""
    slope = MiB
    points = {
        b: int(300 * MiB + slope * b + (slope if i % 2 else -slope)) for i, b in enumerate((80, 90, 100, 110))
    }
    spread = endgame.noise(points, 120.0, 0.5)
    assert spread is not None and 0.5 <= spread <= 2.0, spread


#: ``scripts/workloads/param_heavy.py`` under 1 GiB, headroom 0.1, 32-true/adamw (2026-11-28), each probe as
#: the search saw it: batch -> (peak, the rising phase's reading) in MiB (None: an allocation failed) and
#: the steps it ran. The step's peak is the optimizer step's plateau (~891 MiB) up to about batch 540.
PARAM_HEAVY = {
    8: (891.36, 701.35, 3),
    85: (891.37, 720.48, 3),
    882: (None, 1076.77, 1),
    481: (891.84, 859.36, 3),
    606: (None, 925.76, 1),
    592: (918.44, 918.31, 6),
}
PARAM_HEAVY_LINE = int(921.6 * MiB) - 3 * MiB


def _param_heavy_probe(calls: list[int]) -> object:
    def probe(b: int) -> Observation:
        calls.append(b)
        if b in PARAM_HEAVY:
            peak, reading, steps = PARAM_HEAVY[b]
        else:  # 593 peaked 918.84 MiB, 594 919.50: 0.53 MiB a sample above the plateau
            reading = 918.31 + 0.53 * (b - 592)
            peak, steps = (reading + 0.13 if b > 540 else 891.84), 6
        fits = peak is not None and int(peak * MiB) <= PARAM_HEAVY_LINE
        return Observation(
            b,
            fits,
            kind="fits" if fits else "oom",
            peak_bytes=int(peak * MiB) if peak is not None else None,
            rising_bytes=int(reading * MiB),
            steps=steps if fits or peak is None else 2,
            static_bytes=int(680.2 * MiB) if fits else None,
        )

    return probe


def test_the_gap_over_the_reading_is_read_where_the_peak_left_the_plateau() -> None:
    """The parameter-heavy workload, measured: the fits at 8, 85 and 481 lie on the optimizer step's plateau,
    so between the smallest fit and the largest the peak grew a tenth of the rising reading and no gap was
    read; but the largest fit, 592 (6 steps), peaked 0.13 MiB over its reading, the rising phase's. Read
    without it, the model put the boundary at 592.9 and the end game probed 594 and 593 (both out of memory
    by less than the margin). The two largest fits show the gap: 593, one probe."""
    calls: list[int] = []
    probe = _param_heavy_probe(calls)
    known = [probe(b) for b in (8, 85, 882, 481, 606, 592)]
    calls.clear()
    result = search_max_batch(
        probe, budget_bytes=PARAM_HEAVY_LINE, max_batch_size=65536, known=known,
        guidance=Guidance(final_probe=probe, long_steps=6),
    )  # fmt: skip
    assert result.max_batch_size == 592 and result.status == "exact"
    assert calls == [593], calls


#: The quadratic example again, another run: batch -> (peak, the rising phase's reading, steps) in MiB as
#: the search saw them (None: an allocation failed; the line is 420.90 MiB).
QUADRATIC_RUN = {
    8: (299.84, 299.93, 3),
    237: (313.51, 312.96, 3),
    2035: (365.34, 360.79, 6),
    3314: (None, None, 0),
    2674: (401.33, 396.78, 3),
    2822: (411.00, 406.45, 3),
    2972: (421.29, 416.74, 2),
    2965: (420.82, 416.27, 6),
    2966: (420.89, 416.34, 6),
    2967: (420.95, 416.40, 2),
}


def test_three_points_near_a_convex_boundary_borrow_the_next_one_below_for_the_bend() -> None:
    """After the fits at 2674 and 2822 and the miss at 2972, three points lay near the boundary, too few
    for a parabola: their line read the bend as 2.4 samples of noise, and the end game probed 2965 (fits),
    2967 (no) and 2966. With the fit at 2035, the parabola leaves 0.13: 2966 and 2967."""
    calls: list[int] = []

    def probe(b: int) -> Observation:
        calls.append(b)
        peak, reading, steps = QUADRATIC_RUN[b]
        fits = peak is not None and int(peak * MiB) <= QUADRATIC_LINE
        return Observation(
            b, fits, kind="fits" if fits else "oom", steps=steps,
            peak_bytes=int(peak * MiB) if peak is not None else None,
            rising_bytes=int(reading * MiB) if reading is not None else None,
        )  # fmt: skip

    known = [probe(b) for b in (8, 237, 2035, 3314, 2674, 2822, 2972)]
    calls.clear()
    result = search_max_batch(
        probe, budget_bytes=QUADRATIC_LINE, max_batch_size=65536, known=known,
        guidance=Guidance(final_probe=probe, long_steps=6),
    )  # fmt: skip
    assert result.max_batch_size == 2966 and result.status == "exact"
    assert calls == [2966, 2967], calls
