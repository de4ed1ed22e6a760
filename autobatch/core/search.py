"""The exact largest batch size that fits, found in a handful of probes.

:func:`search_max_batch` is a pure function over a probe callable ("does batch b fit?"). The
answer is decided by feasibility alone; an affine model of peak memory against batch size only
*proposes* where to probe, so a wrong model costs probes, never correctness.

Candidates are the multiples of ``batch_multiple`` up to ``max_batch_size``; the search works on
their indices ``0..n-1`` and keeps a bracket ``lo < hi``: ``lo`` the largest index known to fit
(-1 if none), ``hi`` the smallest index known not to fit (``n`` while none is known). It stops when
``hi == lo + 1``. Every probe is strictly inside the bracket, so no candidate is probed twice.

**Model-guided steps.** The model (:func:`fit_model`) gives a predicted maximum, widened into an
interval by the model's own observed error: the residuals of the fitting points off the line, and
any non-fit the line said would fit (:func:`_predicted_interval`). The step probes the largest
candidate the interval says fits, or else the smallest it says does not, provided that probe, if
the model is right, cuts the remaining work at least as much as a fallback step would. With
exact data the interval is a point, which gives the ideal sequences: 4 probes for an affine curve
without a prior (the smallest candidate; a proportional guess that assumes the whole peak scales
with the batch, a lower bound of the maximum when memory is affine; the predicted maximum; its
neighbour) and 2 with an accurate prior (the predicted maximum; its neighbour). A model whose
"fits" was refuted is ignored until a new fitting point changes it.

**Fallback steps.** Doubling from ``lo`` while no non-fit is known, bisection once bracketed.

**Worst case.** Let ``L = ceil(log2 n)`` and define the remaining work ``R``: 0 when done;
``ceil(log2(hi - lo))`` once bracketed; ``2L - floor(log2(lo + 1))`` while growing; ``2L + 1``
before anything fits. No probe raises ``R`` and every fallback step lowers it by at least 1. The
search keeps a debt ``D = max(0, D + 1 - drop in R)`` per probe and takes a model-guided step only
while ``D < SLACK``; so ``probes <= R_start + SLACK <= 2L + 1 + SLACK`` (:func:`probe_bound`),
whatever the curve, the noise or the prior: at most ``SLACK`` probes more than doubling then
bisection needs in its worst case.

Feasibility is assumed monotone. Observations that contradict it (a fit above a non-fit, as a
device that flickers at the boundary produces) are resolved on the safe side: only fits below the
smallest non-fit count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Literal

__all__ = [
    "KINDS",
    "SLACK",
    "Affine",
    "Observation",
    "ProbeFn",
    "SearchResult",
    "SearchStatus",
    "fit_model",
    "probe_bound",
    "search_max_batch",
]

#: Observation kinds; every kind but "fits" means: does not fit.
KINDS: tuple[str, ...] = ("fits", "oom", "crash", "timeout")
SearchStatus = Literal["exact", "capped", "infeasible", "pruned", "incomplete"]

#: How many probes the model may cost beyond the doubling-then-bisection schedule.
SLACK = 2


@dataclass(frozen=True)
class Observation:
    """The outcome of one probe. A non-fit built with the default kind is recorded as "oom"."""

    batch_size: int
    fits: bool
    peak_bytes: int | None = None  # measured peak when it fits (None if unknown)
    kind: str = "fits"  # "fits" | "oom" | "crash" | "timeout"
    samples_per_second: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if not self.fits and self.kind == "fits":
            object.__setattr__(self, "kind", "oom")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.fits and self.kind != "fits":
            raise ValueError(f"an observation that fits cannot have kind {self.kind!r}")


ProbeFn = Callable[[int], Observation]


@dataclass(frozen=True)
class Affine:
    """``peak(b) = intercept + slope * b`` (bytes)."""

    intercept: float
    slope: float

    def predict(self, batch_size: float) -> float:
        return self.intercept + self.slope * batch_size

    def predict_max(self, budget_bytes: int) -> float | None:
        """The largest real b with ``peak(b) <= budget``; None if the slope is not positive."""
        if not (self.slope > 0 and math.isfinite(self.slope) and math.isfinite(self.intercept)):
            return None
        return (budget_bytes - self.intercept) / self.slope


@dataclass(frozen=True)
class SearchResult:
    """What a search found.

    ``status``: "exact" (``max_batch_size`` fits and the next candidate does not), "capped" (the
    largest candidate fits), "infeasible" (the smallest candidate does not fit; ``max_batch_size``
    is None), "pruned" (a batch at or below ``prune_at_or_below`` does not fit, so this maximum
    cannot beat it) or "incomplete" (``max_probes`` ran out first). For "pruned" and
    "incomplete", ``max_batch_size`` is the largest candidate known to fit (a lower bound of the
    maximum; None if none) and ``upper_bound`` the smallest batch known not to fit.
    """

    max_batch_size: int | None
    status: SearchStatus
    trace: tuple[Observation, ...]  # every new probe, in order (not the ``known`` ones)
    upper_bound: int | None  # smallest batch known not to fit (None if none)
    model: Affine | None  # last affine fit (None if fewer than 2 fitting points and no prior)

    @property
    def probes(self) -> int:
        return len(self.trace)


def probe_bound(max_batch_size: int, batch_multiple: int = 1) -> int:
    """The most probes :func:`search_max_batch` makes over these candidates: ``2*ceil(log2 n) + 1 + SLACK``."""
    n = max_batch_size // batch_multiple
    if n < 1:
        raise ValueError(f"no candidate: max_batch_size {max_batch_size} < batch_multiple {batch_multiple}")
    return 2 * _ceil_log2(n) + 1 + SLACK


def fit_model(points: dict[int, int], prior: Affine | None = None) -> Affine | None:
    """The affine model of peak memory from fitting ``{batch: peak}`` points and an optional prior.

    Two or more points: the secant through the largest and the smallest. Noise and quantisation
    (allocator segments, pages) are absolute errors in bytes, so the widest base gives the most
    accurate slope; curvature (a quadratic loss) shows up as residuals of the points in between,
    which widen the predicted interval instead (:func:`_predicted_interval`). One point and a
    prior: the prior's slope through the point (the prior knows the per-sample cost, the point
    fixes the static part). Otherwise the prior, or None.
    """
    fit = _fit(points, prior)
    return fit[0] if fit is not None else None


def search_max_batch(
    probe: ProbeFn,
    *,
    budget_bytes: int,
    max_batch_size: int,
    batch_multiple: int = 1,
    prior: Affine | None = None,
    known: Iterable[Observation] = (),
    prune_at_or_below: int | None = None,
    max_probes: int | None = None,
) -> SearchResult:
    """Find the largest multiple of ``batch_multiple`` (<= ``max_batch_size``) that fits.

    ``probe(b)`` runs batch ``b`` and returns an :class:`Observation`. ``known`` observations
    (a cache, an earlier run) count as probed and may be at any batch size. ``prior`` predicts the
    peak curve (e.g. from another combination). ``prune_at_or_below``: stop ("pruned") as soon as
    a batch at or below it is known not to fit, and probe the largest candidate at or below it
    early to find out; pass the best maximum so far to skip combinations that cannot reach it, or
    that maximum + 1 to skip those that can at best tie. ``max_probes``: stop ("incomplete") after
    that many new probes. At most :func:`probe_bound` probes are made.
    """
    _check_inputs(budget_bytes, max_batch_size, batch_multiple, prune_at_or_below, max_probes)
    m = batch_multiple
    n = max_batch_size // m
    known_obs = tuple(known)
    trace: list[Observation] = []
    debt = 0
    remaining: int | None = None
    distrust = False  # the model said "fits" and the probe did not: ignore it until a new fit
    while True:
        state = _State.of(known_obs + tuple(trace), m, n)
        status = state.status(prune_at_or_below)
        if status is None and max_probes is not None and len(trace) >= max_probes:
            status = "incomplete"
        if status is not None:
            best = (state.lo + 1) * m if state.lo >= 0 else None
            return SearchResult(best, status, tuple(trace), state.min_fail, fit_model(state.points, prior))
        now = state.remaining()
        if remaining is not None:
            debt = max(0, debt + 1 - (remaining - now))
        remaining = now
        step = None
        if debt < SLACK:
            step = state.guided(prior, budget_bytes, prune_at_or_below, use_model=not distrust)
        index, expect_fit = step if step is not None else (state.fallback(), None)
        batch = (index + 1) * m
        obs = probe(batch)
        if not isinstance(obs, Observation) or obs.batch_size != batch:
            raise ValueError(f"probe({batch}) must return an Observation for batch {batch}, got {obs!r}")
        trace.append(obs)
        distrust = (distrust or expect_fit is True) and not obs.fits


@dataclass(frozen=True)
class _State:
    """The bracket in index space, derived from every observation so far."""

    lo: int
    hi: int
    n: int
    m: int
    min_fail: int | None
    points: dict[int, int]  # consistent fitting batches -> peak (the larger if measured twice)

    @classmethod
    def of(cls, observations: tuple[Observation, ...], m: int, n: int) -> _State:
        min_fail = min((o.batch_size for o in observations if not o.fits), default=None)
        fits = [o for o in observations if o.fits and (min_fail is None or o.batch_size < min_fail)]
        points: dict[int, int] = {}
        for o in fits:
            if o.peak_bytes is not None:
                points[o.batch_size] = max(o.peak_bytes, points.get(o.batch_size, o.peak_bytes))
        lo = min(max((o.batch_size for o in fits), default=0) // m, n) - 1
        hi = n if min_fail is None else min(-(-min_fail // m) - 1, n)
        return cls(lo, hi, n, m, min_fail, points)

    def status(self, prune_at_or_below: int | None) -> SearchStatus | None:
        if self.hi == 0:
            return "infeasible"
        if self.hi == self.lo + 1:
            return "capped" if self.hi == self.n else "exact"
        if prune_at_or_below is not None and self.min_fail is not None and self.min_fail <= prune_at_or_below:
            return "pruned"
        return None

    def remaining(self) -> int:
        """The probes doubling then bisection would still need at most (module docstring)."""
        if self.hi == self.lo + 1:
            return 0
        if self.hi < self.n:
            return _ceil_log2(self.hi - self.lo)
        if self.lo < 0:
            return 2 * _ceil_log2(self.n) + 1
        return 2 * _ceil_log2(self.n) - ((self.lo + 1).bit_length() - 1)

    def fallback(self) -> int:
        if self.hi < self.n:
            return (self.lo + self.hi) // 2
        return 0 if self.lo < 0 else min(2 * self.lo + 1, self.n - 1)

    def guided(
        self, prior: Affine | None, budget: int, prune_at_or_below: int | None, use_model: bool
    ) -> tuple[int, bool | None] | None:
        """A model-guided step: (index, whether the model expects it to fit), or None."""
        step = self._from_model(prior, budget) if use_model else None
        if prune_at_or_below is not None:
            # One probe at the largest candidate <= the threshold settles whether pruning applies.
            edge = prune_at_or_below // self.m - 1
            if self.lo < edge < self.hi and (step is None or step[0] < edge):
                return edge, None
        return step

    def _from_model(self, prior: Affine | None, budget: int) -> tuple[int, bool] | None:
        fit = _fit(self.points, prior)
        if fit is None and len(self.points) == 1:
            ((b, p),) = self.points.items()
            if p > 0:  # proportional: the whole peak scales with the batch
                fit = Affine(0.0, p / b), b, math.inf
        interval = _predicted_interval(*fit, self.points, self.min_fail, budget) if fit else None
        if interval is None:
            return None
        low = min(self._index_at_or_below(interval[0]), self.hi - 1)
        if low > self.lo and self.remaining() - replace(self, lo=low).remaining() >= 1:
            return low, True
        high = max(self._index_at_or_below(interval[1]) + 1, self.lo + 1)
        if high < self.hi and self.remaining() - replace(self, hi=high).remaining() >= 1:
            return high, False
        return None

    def _index_at_or_below(self, batch: float) -> int:
        """Index of the largest candidate <= batch (-1 if none, n if beyond the last)."""
        if batch >= (self.n + 1) * self.m:
            return self.n
        if batch < self.m:
            return -1
        return math.floor(batch / self.m) - 1


def _fit(points: dict[int, int], prior: Affine | None) -> tuple[Affine, int, float] | None:
    """(line, anchor batch, length of the slope's base: inf when the slope is taken as given)."""
    if len(points) >= 2:
        items = sorted(points.items())
        (b1, p1), (b2, p2) = items[0], items[-1]
        slope = (p2 - p1) / (b2 - b1)
        return Affine(p2 - slope * b2, slope), b2, float(b2 - b1)
    if len(points) == 1 and prior is not None:
        ((b, p),) = points.items()
        return Affine(p - prior.slope * b, prior.slope), b, math.inf
    if prior is not None:
        return prior, 0, math.inf
    return None


def _predicted_interval(
    line: Affine, anchor: int, base: float, points: dict[int, int], min_fail: int | None, budget: int
) -> tuple[float, float] | None:
    """Where the line puts the maximum (real batch sizes), widened by the line's observed error.

    The error ``eps`` (bytes) is the largest residual of a fitting point off the line (noise,
    curvature, allocator steps), and at least twice the margin by which the line wrongly
    predicted the smallest non-fit to fit, plus one sample. It also tilts the slope by
    ``2*eps/base`` around the anchor (the largest fitting point).
    """
    slope = line.slope
    if not (slope > 0 and math.isfinite(slope) and math.isfinite(line.intercept)):
        return None
    eps = max((abs(p - line.predict(b)) for b, p in points.items()), default=0.0)
    if min_fail is not None:
        margin = budget - line.predict(min_fail)
        if margin >= 0:
            eps = max(eps, 2 * margin + slope)
    tilt = 2 * eps / base
    room = budget - line.predict(anchor)
    low = anchor + (room - eps) / (slope + tilt)
    high = anchor + (room + eps) / (slope - tilt) if slope > tilt else math.inf
    return low, high


def _ceil_log2(x: int) -> int:
    return (x - 1).bit_length()


def _check_inputs(
    budget_bytes: int,
    max_batch_size: int,
    batch_multiple: int,
    prune_at_or_below: int | None,
    max_probes: int | None,
) -> None:
    for name, value in (("max_batch_size", max_batch_size), ("batch_multiple", batch_multiple)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if max_batch_size < batch_multiple:
        raise ValueError(f"max_batch_size {max_batch_size} is smaller than batch_multiple {batch_multiple}")
    if not budget_bytes > 0:
        raise ValueError(f"budget_bytes must be positive, got {budget_bytes!r}")
    if max_probes is not None and max_probes < 0:
        raise ValueError(f"max_probes must be >= 0, got {max_probes!r}")
    if prune_at_or_below is not None and prune_at_or_below < 0:
        raise ValueError(f"prune_at_or_below must be >= 0, got {prune_at_or_below!r}")
