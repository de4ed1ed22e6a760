"""Where the maximum probably is: a model of peak memory against batch size, for the search to probe.

The model only *proposes* where to probe (:mod:`autobatch.core.search` decides by feasibility
alone). From the fitting points (batch, peak) and an optional prior line, :func:`predict` gives an
interval ``[low, high]`` where the largest fitting batch probably lies: a secant extrapolated to the
budget, widened by the model's own evidence of error (a parabola through the last three points,
residuals, how much the newest point surprised the previous fit). Two secants compete and the
narrower honest interval wins: through the two largest points (tends to the tangent: right for
convex curves and slopes that change with the batch) or through the smallest and the largest
(widest base: right for noisy or quantised peaks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

__all__ = [
    "LIKELY_SHORT",
    "Affine",
    "Point",
    "Prediction",
    "Reading",
    "gap_jitter",
    "model_points",
    "peak_keeps_pace",
    "predict",
    "reported_model",
    "rising_gap",
]


@dataclass(frozen=True)
class Affine:
    """``peak(b) = intercept + slope * b`` (bytes). ``of_readings``: the line follows the rising phase's
    readings plus their gap (:mod:`autobatch.core.search`'s two-phase model), not the step's peaks.
    ``slope_known``: False for a prior whose slope is only a bound (a calibration that did not fit), so
    that the first point re-draws it from the intercept, as a calibration that fits does."""

    intercept: float
    slope: float
    of_readings: bool = False
    slope_known: bool = True

    def predict(self, batch_size: float) -> float:
        return self.intercept + self.slope * batch_size

    def predict_max(self, budget_bytes: int) -> float | None:
        """The largest real b with ``peak(b) <= budget``; None if the slope is not positive."""
        if not (self.slope > 0 and math.isfinite(self.slope) and math.isfinite(self.intercept)):
            return None
        return (budget_bytes - self.intercept) / self.slope


Point = tuple[int, int]  # (batch size, peak bytes) of a fitting probe

#: Where the guess over a likely floor aims, as a fraction of where it puts the boundary. Measured on the
#: benchmark's workloads (the first backward's reading at batch 8 less the probe's own static memory): the
#: guess lay 1-3 % above the maximum on three of seven, up to 60 % below on the rest.
LIKELY_SHORT = 0.95
#: The least share of the scout's reading the guess after it scales (bytes above the static memory the scout
#: measured): a peak moves 0.1-0.5 MiB between processes, so a smaller share says only that a sample costs little.
#: The quadratic workload's scout at batch 8 holds 36 kB of its own (2026-12-01): read as 0.14-0.3 MB, it put the
#: guess at 4078-7112 over a maximum of 3134, each a miss that failed at once.
SCOUT_SHARE = 1 << 20
#: The reported line's base reaches at least this far below its largest point (a fraction of its batch).
REPORTED_BASE = 0.75
#: The least rise between two points a local fit reads (:func:`_spaced`): a choice, above the 0.2-0.4 MiB by
#: which scripts/probe_counts.py moves each probe's process; the real spread between processes is not measured.
LOCAL_RISE = 1 << 20
#: Three points bend (the curve is convex there, and a line through them overshoots) when the middle one
#: lies this far under the chord of the outer two, a fraction of their rise. Noise on a straight line stays
#: under it: the synthetic affine curve with 2 % noise bends 1.1 % at 8, 26 and 321; the quadratic example's
#: curve 8 % at 8, 218 and 2131.
BEND = 0.03


@dataclass(frozen=True)
class Prediction:
    line: Affine  # the model reported in SearchResult.model
    low: float  # the maximum is predicted in [low, high] (real batch sizes)
    high: float
    reported: bool = True  # False for the proportional guess, which is no fit
    #: The three largest points bend (:func:`_bends`) and the parabola through them meets the budget below
    #: the line: the curve is convex there, and ``low`` is the likelier maximum.
    bends: bool = False


def predict(
    points: dict[int, int],
    prior: Affine | None,
    min_fail: int | None,
    budget: int,
    floor: int = 0,
    likely_floor: int | None = None,
) -> Prediction | None:
    """Where the maximum probably is, from the fitting points and the prior.

    Two or more points: the local and the global candidate below, whichever claims the narrower
    interval; when neither rises and there is a prior, as one point (the largest batch at the largest
    peak), and without one, while no non-fit is known, points as flat as the noise reach as far as a slope
    under it would (:func:`_flat_guess`). One point: the prior's slope through it (the prior knows the per-sample cost, the
    point fixes the static part; a guessed slope, the line from the prior's intercept), else the proportional guess (the whole peak above ``floor`` scales
    with the batch: a lower bound of the maximum when memory is affine with an intercept >= floor).
    With ``likely_floor`` (above ``floor``: memory the point's own probe measured as static, its gradients
    included, which a peak early in a backward does not all hold yet), the guess scales only what lies
    above that and its low end aims :data:`LIKELY_SHORT` below: far nearer the maximum when most of the
    point is static (the optimizer step's plateau), no longer a bound; the search passes it only until
    a non-fit is known. No point: the prior. If the line wrongly predicted the smallest non-fit to fit,
    the low end backs off by twice that margin.
    """
    items = sorted(points.items())
    if not items:
        prediction = _exact(prior, budget) if prior is not None else None
    elif len(items) == 1:
        prediction = _from_point(items[0], prior, floor, likely_floor, budget)
    else:
        prediction = _from_points(items, budget)
        if prediction is None and prior is not None:
            # No secant rises: points too close for their noise to show a slope (the quadratic example at
            # bf16-mixed with recomputation: 420.3 MiB at 2935, 411.0 at 2944, and the search doubled to 5888
            # and bisected down from there: 18 probes to 2946). The prior's slope through the largest batch at
            # the largest peak, which a peak that never falls as the batch grows reaches there at least.
            # (Without a prior, points as flat as the noise: the slope that noise could hide, below.)
            prediction = _from_point((items[-1][0], max(p for _, p in items)), prior, floor, None, budget)
        elif prediction is None and min_fail is None and _flat(items):
            prediction = _flat_guess(items, budget)
    if prediction is None or math.isnan(prediction.low) or math.isnan(prediction.high):
        return None
    if min_fail is None:
        return prediction
    line, center = prediction.line, prediction.line.predict_max(budget)
    margin = budget - line.predict(min_fail)
    if center is None or margin < 0:
        return prediction
    return replace(prediction, low=min(prediction.low, center - (2 * margin + line.slope) / line.slope))


def _flat(items: list[Point]) -> bool:
    """Whether the points lie within :data:`SCOUT_SHARE` of each other: as flat as a peak is between processes."""
    peaks = [p for _, p in items]
    return max(peaks) - min(peaks) < SCOUT_SHARE and items[-1][0] > items[0][0]


def _flat_guess(items: list[Point], budget: int) -> Prediction | None:
    """Points as flat as the noise: the guess a slope of :data:`SCOUT_SHARE` over their span would reach, from
    the largest point at the highest peak. A steeper slope would have lifted the largest point above the noise,
    so this is where an affine curve reaches the budget at the earliest; a high-water mark that something else
    set (a data set prepared at import, the optimizer step's plateau) may hide a steeper one, which a miss then
    shows. Doubling from points that flat climbed a factor of two a probe (an as-is loop whose data set,
    prepared at import, held its reading flat to about a thousand samples: 8, 23, 46 and 92 before a point rose).
    Not a fit: the end game does not plan over it."""
    span = items[-1][0] - items[0][0]
    slope = SCOUT_SHARE / span
    top = max(p for _, p in items)
    return _exact(Affine(top - slope * items[-1][0], slope), budget, reported=False)


def _from_points(items: list[Point], budget: int) -> Prediction | None:
    """Two points or more: the local or the global candidate, whichever claims the narrower interval."""
    local = _anchored(_local(_spaced(items), budget), items, budget)
    options = [c for c in (local, _global(items, budget)) if c is not None]
    return min(options, key=lambda c: c.high - c.low) if options else None


def _from_point(
    point: Point, prior: Affine | None, floor: int, likely_floor: int | None, budget: int
) -> Prediction | None:
    """One point: the prior's slope through it, else the proportional guess."""
    if prior is None:
        return _proportional(point, floor, likely_floor, budget)
    b, p = point
    # A guessed slope gives way to the line from the prior's intercept through the point (gpt at bf16-mixed
    # with recomputation: after its calibration ran out of memory, the slope it was scaled from, 5.4 MiB a
    # sample against 3.2, drew three 10-step probes at 41, 54 and 62 under a maximum of 63).
    slope = prior.slope if prior.slope_known or p <= prior.intercept else (p - prior.intercept) / b
    return _exact(Affine(p - slope * b, slope), budget)


def _proportional(point: Point, floor: int, likely_floor: int | None, budget: int) -> Prediction | None:
    """The proportional guess through one point: what lies above the floor scales with the batch. The probe's
    own static memory, read in the process that peaked, comes first, even under the floor: that is read from
    another process (the inspection's), whose baseline may lie a MiB above the probe's, more than a small
    batch's whole share (the quadratic workload simulated so: 0.07 MiB left above the floor at batch 8)."""
    b, p = point
    if likely_floor is not None and likely_floor < p:
        share = max(p - likely_floor, SCOUT_SHARE)
        guess = _exact(Affine(float(likely_floor), share / b), budget, reported=False)
        if guess is not None:
            return replace(guess, low=LIKELY_SHORT * guess.low)
    base = floor if 0 < floor < p else 0
    return _exact(Affine(float(base), (p - base) / b), budget, reported=False) if p > 0 else None


def reported_model(
    points: dict[int, int], prior: Affine | None, min_fail: int | None, budget: int
) -> Affine | None:
    """The model a result reports (and the next combinations' priors are drawn from): with two points or
    more, the secant from the largest to the largest at most :data:`REPORTED_BASE` of its batch, a base
    wide enough that a sample's noise does not set the slope (the MLP example at bf16-mixed: fits at 35
    and 50 and a miss's point at 51; the secant of 50 and 51 read 1.49 MiB per sample in one run and
    1.14 in another, and the next combination's calibration went astray); else the prediction's line
    (None without one)."""
    items = sorted(points.items())
    if len(items) >= 2:
        last = items[-1]
        wide = [p for p in items[:-1] if p[0] <= REPORTED_BASE * last[0]]
        return _secant(wide[-1] if wide else items[0], last)
    prediction = predict(points, prior, min_fail, budget)
    if prediction is not None and prediction.reported:
        return prediction.line
    if items and prior is not None:
        return Affine(items[0][1] - prior.slope * items[0][0], prior.slope)
    return prior


Reading = tuple[int, Optional[int], Optional[int]]  # (batch, peak, rising phase's reading) of a probe


def rising_gap(fits: list[Reading]) -> int:
    """How far the step's peak lies above the rising phase's reading once that phase sets it (0: unknown;
    negative: under it, as the quadratic workload's peaks lie 0.1 MB under their readings), from fits
    ``(batch, peak, rising)``.

    The rising phase's reading misses what later steps add (an autocast cache, allocator creep): measured
    here near the boundary, 0.1 MiB at 32-true and 8 MiB at bf16-mixed. It is read at the largest fit when
    the step's peak grew from the smallest fit's by at least a quarter of what the rising phase grew (so
    the optimizer step's flat peak no longer sets it), and, unless the peak grew nearly as much (three
    quarters), when it is smaller than that growth: a gap above everything the rising phase added between
    the fits is the optimizer step's peak, still flat but for a few MiB of batch-dependent temporaries
    (measured on a parameter-heavy model: from batch 8 to 24 its peak grew about 5 MiB, over half the
    rising reading's growth, and lay 186 MiB above that reading). A peak that follows the reading is set by
    it, whatever the gap against the growth between two close fits (the root tune's sgd fits at 24 and 25:
    both grew 5 MiB and the gap is 10.9; taken for no gap, it put the boundary at 27 instead of 25).
    """
    ends = _phase_growth(fits)
    if ends is None:
        return 0
    grew, peak_grew, gap = ends
    if grew <= 0 or peak_grew < grew / 4 or (peak_grew < 3 * grew / 4 and gap > grew):
        return 0
    return gap


def model_points(
    fits: list[Reading], misses: list[Reading], line: int, primed: bool | None
) -> tuple[dict[int, int], bool]:
    """The points the model is fitted to, from the consistent fits and the batches that did not fit under
    ``line``, and whether they are the rising phase's readings plus the gap (:func:`_phase_gap`) rather
    than the step's peaks. ``primed``: how the prior's line was drawn (:attr:`Affine.of_readings`; None:
    no prior).

    Readings when every fit has one and two fits show a peak that did not keep pace with them (the
    optimizer step's plateau says nothing of where the batch-dependent phase meets the budget; where the
    peak kept pace, its own slope is the better one). One fit alone, or fits whose readings did not grow
    (too close to show a pace): as the prior's line was drawn, since
    its slope goes through it (through the reading, where the prior followed the peaks, the MLP example's
    grid probes landed 3 to 11 samples above the boundary, one miss after another); without a prior, the
    reading, which the proportional guess scales and which grows faster than a plateau. A miss adds a point
    above the line, next to a fit (an interpolation instead of an extrapolation): its reading plus the gap,
    or the peak of the step at which it stopped past the line (a lower bound, near its own peak), and before
    any fit, the point a prior's slope goes through; a miss whose allocation failed has no such peak (how
    high it got before says nothing of where the curve crosses the line).
    """
    measured: list[Reading] = [(b, p, r) for b, p, r in fits if p is not None]
    phased = bool(measured) and all(r is not None for _, _, r in measured)
    grew = _phase_growth(measured)
    if phased and grew is not None and grew[0] > 0:
        phased = not peak_keeps_pace(measured)
    elif phased:
        # One fit, or readings that did not grow: fits too close for their noise to show a pace (the
        # quadratic example at bf16-mixed with recomputation: readings 405.96 and 404.64 MiB at 2935 and
        # 2944, peaks 420.34 and 411.0; read as a plateau, with no gap, they put the boundary at 3176
        # against 2946).
        phased = primed is not False
    points: dict[int, int] = {}
    if phased:
        read = [(b, p, r) for b, p, r in misses if r is not None]
        gap = _phase_gap(measured, [(p, r) for _, p, r in read], line)
        values = [(b, r + gap) for b, _, r in [*measured, *read] if r is not None]
    else:
        # Without a fit, a miss is a point only for a prior's slope to go through (the calibration of the MLP
        # example's recomputation missed at 42 and at 32, 0.05 MiB over the line: the slope through it puts
        # the maximum at 31, where the search had gone back to bisecting).
        keep = bool(measured) or primed is not None
        over = _rising([(b, p) for b, p, _ in misses if p is not None and p >= line]) if keep else []
        values = [(b, p) for b, p, _ in measured if p is not None] + over
    for b, value in values:
        points[b] = max(value, points.get(b, value))
    return points, phased


def _rising(misses: list[Point]) -> list[Point]:
    """The misses whose point lies above every smaller miss's. A miss's point is the peak of the step at which
    it stopped, a lower bound: one under a smaller batch's says only that it stopped a step earlier (the
    quadratic workload: 3165 stopped at its second step at 421.03 MiB, 3167 at its first at 420.95; the
    secant through them fell, and the search bisected up from 2683 in 10 probes)."""
    kept: list[Point] = []
    for b, p in sorted(misses):
        if not kept or p > kept[-1][1]:
            kept.append((b, p))
    return kept


def _phase_gap(fits: list[Reading], misses: list[tuple[int | None, int | None]], line: int) -> int:
    """How far the step's peak lies above the rising phase's reading, for the search's model, from fits
    ``(batch, peak, rising)`` and batches that did not fit under ``line``, ``(peak reached, rising)``:
    :func:`rising_gap`, raised to what every miss proves. A miss peaked at or above the line, and at
    least as high as the peak it reached before it stopped, so the gap is at least either less its reading
    (a parameter-heavy model at bf16-mixed: fits on the optimizer step's plateau read no gap, the first
    miss reached 8 MiB above its reading, and without it the search crept down a sample a probe).
    """
    proven = [max(line, p or 0) - r for p, r in misses if r is not None]
    return max([rising_gap(fits), *proven])


def gap_jitter(fits: list[Reading], misses: list[Reading], line: int) -> int:
    """How far the step's peak moved against the rising phase's reading between the probes near ``line`` (bytes;
    0: fewer than two tell), from fits and misses ``(batch, peak, rising)`` whose reading lies within
    :data:`LOCAL_RISE` of it: the widest a fit's own gap and what a miss proves of its gap (:func:`_phase_gap`)
    lie apart. A model of readings plus one gap does not see it, since the readings themselves are smooth; it
    is the noise that decides whether a batch near the boundary fits (an as-is loop with DataLoader workers:
    fits at 7187-7190 peaked 0.08 MiB under their readings, a miss at 7191 0.12 MiB over its own, 12 samples).
    """
    gaps = [p - r for _, p, r in fits if p is not None and r is not None and abs(line - r) <= LOCAL_RISE]
    proven = [max(line, p or 0) - r for _, p, r in misses if r is not None and abs(line - r) <= LOCAL_RISE]
    if not gaps or len(gaps) + len(proven) < 2:
        return 0
    return max(0, max(gaps + proven) - min(gaps))


def peak_keeps_pace(fits: list[Reading]) -> bool:
    """Whether the step's peak grew at least as much as the rising phase's reading between the smallest and
    the largest of the fits ``(batch, peak, rising)``: then a batch-dependent phase sets the peak, and the
    peak's own slope is the one to model. The reading is the first backward's; a later step can grow faster
    with the batch (the MLP example: 1.76 MiB per sample against the reading's 1.5, so a line through the
    readings put the boundary three samples high)."""
    ends = _phase_growth(fits)
    return ends is not None and 0 < ends[0] <= ends[1]


def _phase_growth(fits: list[Reading]) -> tuple[int, int, int] | None:
    """From the smallest to the largest of the fits ``(batch, peak, rising)`` that have both readings: how
    much the rising reading grew, how much the peak grew, and the peak above the reading at the largest
    (None: fewer than two such fits)."""
    both = sorted((b, p, r) for b, p, r in fits if p is not None and r is not None)
    if len(both) < 2:
        return None
    (_, small_peak, small_rising), (_, large_peak, large_rising) = both[0], both[-1]
    return large_rising - small_rising, large_peak - small_peak, large_peak - large_rising


def _exact(line: Affine, budget: int, reported: bool = True) -> Prediction | None:
    center = line.predict_max(budget)
    return (
        Prediction(line, center, center, reported) if center is not None and math.isfinite(center) else None
    )


def _spaced(items: list[Point]) -> list[Point]:
    """The points a local fit reads: from the largest down, each at least :data:`LOCAL_RISE` under the one
    above it (the smaller of two closer ones left out). Two fits a sample or two apart near the boundary differ
    by less than a peak can vary between processes: the secant through them says nothing of the slope (the
    simulated quadratic workload with noise between processes: 420.89 MiB at 3166, 420.67 at 3167)."""
    kept = [items[-1]]
    for b, p in reversed(items[:-1]):
        if p <= kept[-1][1] - LOCAL_RISE:
            kept.append((b, p))
    return kept[::-1] if len(kept) >= 2 else items


def _local(items: list[Point], budget: int) -> Prediction | None:
    """The secant through the two largest points, spread to the root of the parabola through the
    three largest and by the noise that the last point's surprise implies (a share of it, as the boundary lies
    nearer the last point than that point lay to the one below); between a fit and a miss's point on a curve
    that bends everywhere, the parabola's root.

    Near the boundary this tends to the tangent: right for convex (quadratic) curves and for
    curves whose slope changes with the batch (allocator regimes seen on the CPU).
    """
    line = _secant(items[-2], items[-1])
    center = line.predict_max(budget)
    if center is None:
        return None
    low = high = center
    bends = False
    if len(items) >= 3:
        root = _parabola_root(items[-3:], budget)
        low, high = min(low, root), max(high, root)
        bends = root < center and _bends(items[-3:])
        if bends and len(items) == 3 and items[-1][1] < budget:
            # Three fits that bend: the last one's surprise against the secant below it is the bend, which
            # the parabola through them takes in, not noise (the quadratic workload: 8, 1235 and 2654 put
            # the root at 3166 against a maximum of 3160, and a spread from that surprise 622 samples wide
            # drew a probe at 2776).
            return Prediction(line, low, high, bends=bends)
        if len(items) == 3 and items[-2][1] < budget <= items[-1][1] and _bends(items):
            # A fit and a miss's point above the budget that bend with the point below them: the boundary lies
            # between the two, at or past the chord's crossing (the curve is convex) and at most the parabola's
            # root. The surprise is the bend, not noise, and the chord is the likelier end: a rising reading is
            # straight above the batch where the build's own high-water mark stops setting it (param_heavy: 8,
            # 376 and a miss at 847 cross at 621.7, the maximum 621; the spread from the surprise drew a 3-step
            # probe at 611, and two more to the boundary).
            return Prediction(line, low, high, bends=True)
        between = items[-2][1] < budget <= items[-1][1] and items[-2][0] < root <= items[-1][0]
        if between and len(items) >= 4 and _bends(items[-3:]):
            # A fit and a miss's point a few samples past the budget, over a curve that bends everywhere: the
            # parabola through the three largest interpolates, and its root is the center; the chord crosses
            # early on a convex curve (the quadratic workload: 2659 and a miss at 3132 cross at 3119.8, the
            # parabola at 3120.7, the maximum 3120; the chord drew a probe at 3119).
            line, center = _tangent(items[-3:], root, budget), root
        (b, p), rest = items[-1], items[:-1]
        # The surprise neither the secant nor the parabola below the last point explains: a curve that bends
        # everywhere (a batch x batch loss) follows the parabola; one that bent once, at its smallest point, and
        # is straight since, the secant (param_heavy: the parabola through 8, 376 and 611 missed 847 by 39 MiB, the
        # secant through 376 and 611 by 0.03; read as noise, the 39 drew a probe 21 samples past the boundary).
        surprise = abs(_secant(rest[-2], rest[-1]).predict(b) - p)
        if len(rest) >= 3:
            surprise = min(surprise, abs(_parabola(rest[-3:], b) - p))
        # Where the points below bend, that surprise is the curvature's error over an extrapolation ``reach``
        # long; the one from the last point to the boundary errs by its share, where it is shorter (on a noisy
        # straight line the points do not bend, and the surprise stays the points' noise; the quadratic workload: the parabola through 8, 935
        # and 2659 missed 3132 by 0.85 MiB, 11 samples; read as the noise of every point, it spread the interval
        # 10 samples under 3120 and drew a 3-step probe at 3109, where the maximum, 12 samples from 3132, was
        # 3120: a point's own noise there is 0.01-0.025 MiB).
        reach = b - rest[-1][0]
        noise = _noise(surprise, rest[-1][0] - rest[-2][0], reach)
        if p >= budget and len(rest) >= 3 and _bends(rest[-3:]):
            noise *= min(1.0, abs(center - b) / reach)
        spread = noise * (1 + max(0.0, center - b) / reach) / line.slope
        low, high = min(low, center - spread), max(high, center + spread)
    return Prediction(line, low, high, bends=bends)


def _anchored(prediction: Prediction | None, items: list[Point], budget: int) -> Prediction | None:
    """The local line moved to where the points near the budget put the boundary, its slope kept.

    A local fit reads points :data:`LOCAL_RISE` apart, which leaves out the fits and misses a sample or two from
    the boundary: their secant says nothing of the slope, but each, carried along the local slope, says where
    the boundary lies, within the noise of one probe. Their mean is the center, their spread the interval's
    (the quadratic workload: a miss at 3137 put the boundary at 3132.5, a fit at 3132 confirmed that came
    after it at 3133.0, and the model, still at 3132.5, was refuted by it and left the search to bisect)."""
    if prediction is None:
        return None
    line = prediction.line
    near = [b + (budget - p) / line.slope for b, p in items if abs(budget - p) <= LOCAL_RISE]
    if len(near) < 2 or not line.slope > 0:
        return prediction
    center = sum(near) / len(near)
    line = Affine(budget - line.slope * center, line.slope)
    return Prediction(line, min(near), max(near), bends=prediction.bends)


def _global(items: list[Point], budget: int) -> Prediction | None:
    """The secant through the smallest and the largest point, spread by the largest residual of
    the points between and by the noise the last point's surprise implies; where the three largest points
    bend, down to the root of the parabola through them.

    The widest base makes absolute errors (noise, allocator segments, pages) matter least. On a convex
    curve it overshoots: the quadratic example (a batch x batch loss) drew 4708 and 3710 over a maximum of
    3015, which the parabola through 8, 218 and 2131 puts within a sample.
    """
    b1, (b2, p2) = items[0][0], items[-1]
    line, bends = _secant(items[0], items[-1]), False
    slope, room = line.slope, budget - p2
    if not slope > 0:
        return None
    eps = max(abs(p - line.predict(b)) for b, p in items)
    tilt = 2 * eps / (b2 - b1)  # the slope's uncertainty, pivoting on the largest point
    low = b2 + (room - eps) / (slope + tilt)
    high = b2 + (room + eps) / (slope - tilt) if slope > tilt else math.inf
    if len(items) >= 3:
        center, before = b2 + room / slope, items[-2][0]
        noise = _noise(abs(_secant(items[0], items[-2]).predict(b2) - p2), before - b1, b2 - before)
        spread = noise * (1 + max(0.0, center - b2) / (b2 - b1)) / slope
        low, high = min(low, center - spread), max(high, center + spread)
        if _bends(items[-3:]):
            root = _parabola_root(items[-3:], budget)
            low, bends = min(low, root), root < center
    return Prediction(line, low, high, bends=bends)


def _bends(three: list[Point]) -> bool:
    """Whether three points bend upwards: the middle one lies :data:`BEND` of their rise under the chord."""
    (b0, p0), (b1, p1), (b2, p2) = three
    chord = p0 + (p2 - p0) * (b1 - b0) / (b2 - b0)
    return p2 > p0 and chord - p1 >= BEND * (p2 - p0)


def _noise(miss: float, base: float, reach: float) -> float:
    """The measurement noise implied by a miss of ``miss`` bytes when a secant of base ``base``
    was extrapolated ``reach`` beyond its end (the error grows as 1 + reach/base)."""
    return miss / (1 + reach / base)


def _secant(first: Point, last: Point) -> Affine:
    slope = (last[1] - first[1]) / (last[0] - first[0])
    return Affine(last[1] - slope * last[0], slope)


def _newton(three: list[Point]) -> tuple[float, float]:
    """Slope of the last two of three points and the second divided difference (curvature)."""
    (b0, p0), (b1, p1), (b2, p2) = three
    s12 = (p2 - p1) / (b2 - b1)
    return s12, (s12 - (p1 - p0) / (b1 - b0)) / (b2 - b0)


def _parabola(three: list[Point], x: float) -> float:
    """The parabola through three points, at x (Newton form)."""
    (_, (b1, _), (b2, p2)), (s12, q) = three, _newton(three)
    return p2 + s12 * (x - b2) + q * (x - b2) * (x - b1)


def _tangent(three: list[Point], x: float, budget: int) -> Affine:
    """The line tangent to the parabola through three points at x, through the budget there."""
    (_, (b1, _), (b2, _)), (s12, q) = three, _newton(three)
    slope = s12 + q * ((x - b2) + (x - b1))
    return Affine(budget - slope * x, slope)


def _parabola_root(three: list[Point], budget: int) -> float:
    """Where the parabola through three points first reaches the budget beyond the last (inf: never)."""
    (_, (b1, _), (b2, p2)), (s12, q) = three, _newton(three)
    room, linear = budget - p2, q * (b2 - b1) + s12
    disc = linear * linear + 4 * q * room  # q u^2 + linear u - room = 0, u = x - b2
    denominator = linear + math.sqrt(disc) if disc >= 0 else 0.0
    return b2 + 2 * room / denominator if denominator > 0 else math.inf
