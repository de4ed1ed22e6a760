"""The exact largest batch size that fits, found in a handful of probes.

``search_max_batch`` is a pure function over a probe callable ("does batch b fit?"). The answer is
decided by feasibility alone; an affine model of peak memory against batch size only *proposes*
where to probe next, so a wrong model costs probes, never correctness.

Candidates are the multiples of ``batch_multiple`` up to ``max_batch_size``; the search works on
their indices ``0..n-1`` and keeps a bracket ``lo < hi``: ``lo`` the largest index known to fit
(-1 if none), ``hi`` the smallest index known not to fit (``n`` if none, i.e. not yet bracketed).
It stops when ``hi == lo + 1``. Each step probes one index strictly inside the bracket, so no
candidate is ever probed twice. A step is one of:

* **model-guided**: the floor of the model's predicted maximum, clamped into the bracket (if the
  model says ``lo`` is the maximum, probe ``lo+1`` to verify; if it says ``hi`` or beyond, probe
  ``hi-1``). The model is a secant through the two largest fitting points (see :func:`fit_model`);
  with one fitting point and a ``prior``, the prior's slope through that point; with only a prior,
  the prior; with one fitting point and nothing else, the point's peak scaled in proportion to the
  batch (a lower bound of the maximum when memory is affine with a non-negative intercept, so this
  second probe most likely fits and gives the secant a long base).
* **fallback**: doubling from ``lo`` while no non-fit is known, bisection once bracketed.

**Worst case.** Let ``L = ceil(log2 n)`` and define the remaining work ``R``: 0 when done;
``ceil(log2(hi - lo))`` once bracketed; ``2L - floor(log2(lo + 1))`` while growing (``2L + 1`` before
anything fits). Every fallback step lowers ``R`` by at least 1 and no step raises it. The search
tracks its debt ``D = probes - (R_start - R)`` and takes a model-guided step only while
``D < SLACK``; fallback steps never raise ``D``. Hence ``probes <= R_start + SLACK <= 2L + 1 + SLACK``
(:func:`probe_bound`), whatever the curve, the noise or the prior, while an accurate model keeps
the ideal sequences: 4 probes for an affine curve without prior (smallest, proportional guess,
predicted maximum, its neighbour) and 2 with an accurate prior (predicted maximum, its neighbour).

Feasibility is assumed monotone. Observations that contradict it (a fit above a non-fit, e.g. a
device that flickers at the boundary) are resolved on the safe side: only fits below the smallest
non-fit count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "SLACK",
    "Affine",
    "Observation",
    "ProbeFn",
    "SearchResult",
    "fit_model",
    "probe_bound",
    "search_max_batch",
]

KINDS: tuple[str, ...] = ("fits", "oom", "crash", "timeout")
SearchStatus = Literal["exact", "capped", "infeasible", "pruned", "incomplete"]

#: How many probes the model may fall behind the exponential-growth-then-bisection schedule.
SLACK = 3


@dataclass(frozen=True)
class Observation:
    """The outcome of one probe. Every kind but "fits" means: does not fit.

    A non-fit built with the default kind is recorded as "oom".
    """

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
    is None), "pruned" (a non-fit at or below ``prune_at_or_below``: this maximum cannot beat it)
    or "incomplete" (``max_probes`` ran out first). For "pruned" and "incomplete",
    ``max_batch_size`` is the largest candidate known to fit (a lower bound; None if none) and
    ``upper_bound`` the smallest batch known not to fit.
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
    """The most probes :func:`search_max_batch` can make over these candidates (module docstring)."""
    n = max_batch_size // batch_multiple
    if n < 1:
        raise ValueError(f"no candidate: max_batch_size {max_batch_size} < batch_multiple {batch_multiple}")
    return 2 * _ceil_log2(n) + 1 + SLACK


def fit_model(points: dict[int, int], prior: Affine | None = None) -> Affine | None:
    """The affine model of peak memory, from fitting ``{batch: peak}`` points (and a prior)."""
    fit = _fit(points, prior)
    return fit[0] if fit is not None else None


def _fit(points: dict[int, int], prior: Affine | None) -> tuple[Affine, int, float] | None:
    """(line, anchor batch, base length of the slope; inf when the slope is taken as given)."""
    if len(points) >= 2:
        items = sorted(points.items())
        b2, p2 = items[-1]
        if STRATEGY == "near":
            b1, p1 = items[-2]
        elif STRATEGY == "far":
            b1, p1 = items[0]
        else:
            below = [(b, p) for b, p in items if b <= b2 * FRAC]
            b1, p1 = below[-1] if below else items[0]
        slope = (p2 - p1) / (b2 - b1)
        return Affine(p2 - slope * b2, slope), b2, float(b2 - b1)
    if len(points) == 1 and prior is not None:
        ((b, p),) = points.items()
        return Affine(p - prior.slope * b, prior.slope), b, math.inf
    if prior is not None:
        return prior, 0, math.inf
    return None


STRATEGY = "far"
DISTRUST = True
FRAC = 0.5


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
    (from a cache or an earlier run) count as probed and may be at any batch size. ``prior``
    predicts the peak curve (e.g. from another combination). ``prune_at_or_below``: stop as soon
    as a batch at or below it is known not to fit. ``max_probes``: stop after that many new probes.
    At most :func:`probe_bound` probes are made.
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
            step = state.guided(prior, budget_bytes, prune_at_or_below, use_model=not (distrust and DISTRUST))
        index, expect_fit = step if step is not None else (state.fallback(), None)
        obs = probe((index + 1) * m)
        if not isinstance(obs, Observation) or obs.batch_size != (index + 1) * m:
            raise ValueError(f"probe({(index + 1) * m}) must return an Observation for that batch, got {obs!r}")
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
        max_fit = max((o.batch_size for o in fits), default=0)
        lo = min(max_fit // m, n) - 1
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
        """The probes exponential growth then bisection would still need (module docstring)."""
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
        """A model-guided step (index, whether the model expects it to fit), or None."""
        step = self._from_model(prior, budget) if use_model else None
        if prune_at_or_below is not None:
            # One probe just above the threshold settles whether this search can matter at all.
            above = prune_at_or_below // self.m
            if self.lo < above < self.hi and (step is None or step[0] <= above):
                return above, None
        return step

    def _from_model(self, prior: Affine | None, budget: int) -> tuple[int, bool] | None:
        fit = _fit(self.points, prior)
        if fit is None and len(self.points) == 1 and self.hi == self.n:
            ((b, p),) = self.points.items()
            if p > 0:  # proportional: the whole peak scales with the batch (a lower bound if affine)
                fit = Affine(0.0, p / b), b, math.inf
        interval = _predicted_interval(*fit, self.points, self.min_fail, budget) if fit else None
        if interval is None:
            return None
        # Probe the largest candidate the model says fits, or the smallest it says does not,
        # whichever first would cut the remaining work at least as much as a fallback step.
        low = min(self._index_at_or_below(interval[0]), self.hi - 1)
        if low > self.lo and self.remaining() - _State.remaining(self._with(lo=low)) >= 1:
            return low, True
        high = max(self._index_at_or_below(interval[1]) + 1, self.lo + 1)
        if high < self.hi and self.remaining() - _State.remaining(self._with(hi=high)) >= 1:
            return high, False
        return None

    def _with(self, lo: int | None = None, hi: int | None = None) -> _State:
        lo = self.lo if lo is None else lo
        hi = self.hi if hi is None else hi
        return _State(lo, hi, self.n, self.m, self.min_fail, self.points)

    def _index_at_or_below(self, batch: float) -> int:
        """Index of the largest candidate <= batch (-1 if none, n if beyond the last)."""
        if batch >= (self.n + 1) * self.m:
            return self.n
        if batch < self.m:
            return -1
        return math.floor(batch / self.m) - 1


def _predicted_interval(
    line: Affine, anchor: int, base: float, points: dict[int, int], min_fail: int | None, budget: int
) -> tuple[float, float] | None:
    """Where the model puts the maximum, widened by the model's observed error.

    The error ``eps`` (bytes) is the largest residual of a fitting point off the line (noise,
    curvature, allocator steps), and at least twice the margin by which the line wrongly predicted
    the smallest non-fit to fit (so repeated misses back off geometrically). It also bends the
    slope by ``2*eps/base`` around the anchor.
    """
    slope = line.slope
    if not (slope > 0 and math.isfinite(slope) and math.isfinite(line.intercept)):
        return None
    eps = max((abs(p - line.predict(b)) for b, p in points.items()), default=0.0)
    if min_fail is not None:
        margin = budget - line.predict(min_fail)
        if margin >= 0:
            eps = max(eps, 2 * margin + slope)
    bend = 2 * eps / base
    room = budget - line.predict(anchor)
    low = anchor + (room - eps) / (slope + bend)
    high = anchor + (room + eps) / (slope - bend) if slope > bend else math.inf
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
