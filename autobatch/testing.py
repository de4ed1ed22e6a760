"""Fake probes: exercise the search, the runner and the CLI without torch or a device.

In the spirit of httpx's ``MockTransport``: the search talks to a probe callable
(``autobatch.core.search.ProbeFn``), so a synthetic memory curve and a budget stand in for a real
device. A curve maps a batch size to the peak bytes of a training step:

* :func:`affine` ``a + k*b`` — the common case (static memory + activations per sample);
* :func:`quadratic` ``a + k*b + q*b*b`` — a loss with a batch x batch similarity matrix;
* :func:`staircase` — an affine curve rounded up to allocator segments (flat runs, then jumps);
* :func:`noisy` — any curve whose *measured* peak carries a few % of deterministic noise while
  feasibility still follows the true curve (measurement noise, not a flickering device).

:class:`FakeProbe` answers "does batch b fit?" from a curve and a budget and records every call;
:func:`true_max` is the brute-force oracle the property tests compare the search against.
Pure Python: importable without torch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from autobatch.core.search import Observation

__all__ = [
    "AffineCurve",
    "Curve",
    "FakeProbe",
    "NoisyCurve",
    "QuadraticCurve",
    "StaircaseCurve",
    "affine",
    "noisy",
    "quadratic",
    "staircase",
    "true_max",
]


class Curve:
    """Peak bytes of one training step as a function of the batch size.

    ``curve(b)`` is the true peak, which decides feasibility; ``curve.measure(b)`` is what a probe
    would report (the same, unless the curve is :func:`noisy`).
    """

    def __call__(self, batch_size: int) -> int:
        raise NotImplementedError

    def measure(self, batch_size: int) -> int:
        return self(batch_size)


@dataclass(frozen=True)
class AffineCurve(Curve):
    intercept: float
    slope: float

    def __call__(self, batch_size: int) -> int:
        return math.ceil(self.intercept + self.slope * batch_size)


@dataclass(frozen=True)
class QuadraticCurve(Curve):
    intercept: float
    slope: float
    curvature: float

    def __call__(self, batch_size: int) -> int:
        b = batch_size
        return math.ceil(self.intercept + self.slope * b + self.curvature * b * b)


@dataclass(frozen=True)
class StaircaseCurve(Curve):
    intercept: float
    slope: float
    step_bytes: int

    def __call__(self, batch_size: int) -> int:
        raw = self.intercept + self.slope * batch_size
        return math.ceil(raw / self.step_bytes) * self.step_bytes


@dataclass(frozen=True)
class NoisyCurve(Curve):
    curve: Curve
    rel: float
    seed: int

    def __call__(self, batch_size: int) -> int:
        return self.curve(batch_size)

    def measure(self, batch_size: int) -> int:
        # Deterministic per (seed, batch): re-measuring the same batch gives the same number.
        rng = random.Random(self.seed * 1_000_003 + batch_size)
        return max(0, round(self.curve.measure(batch_size) * (1 + rng.uniform(-self.rel, self.rel))))


def affine(intercept: float, slope: float) -> AffineCurve:
    """``peak(b) = intercept + slope*b`` bytes."""
    return AffineCurve(intercept, slope)


def quadratic(a: float, k: float, q: float) -> QuadraticCurve:
    """``peak(b) = a + k*b + q*b*b`` bytes (a batch x batch term, as in contrastive losses)."""
    return QuadraticCurve(a, k, q)


def staircase(a: float, k: float, step_bytes: int) -> StaircaseCurve:
    """``a + k*b`` rounded up to a multiple of ``step_bytes`` (allocator segments)."""
    if step_bytes < 1:
        raise ValueError(f"step_bytes must be >= 1, got {step_bytes}")
    return StaircaseCurve(a, k, step_bytes)


def noisy(curve: Curve, rel: float = 0.02, seed: int = 0) -> NoisyCurve:
    """``curve`` whose measured peaks are off by up to ``rel`` (uniform); feasibility is unchanged."""
    if not 0 <= rel < 1:
        raise ValueError(f"rel must be in [0, 1), got {rel}")
    return NoisyCurve(curve, rel, seed)


@dataclass
class FakeProbe:
    """A :data:`~autobatch.core.search.ProbeFn` over a synthetic curve: fits iff ``curve(b) <= budget``.

    ``calls`` records every batch size asked for, in order. ``fail_kind`` is the kind reported when
    a batch does not fit ("oom" by default; "crash"/"timeout" to exercise those paths).
    ``report_peaks=False`` hides the peak (a device that cannot measure it).
    ``throughput`` optionally maps a batch size to samples per second, reported for fitting probes.
    """

    curve: Curve | Callable[[int], float]
    budget_bytes: int
    fail_kind: str = "oom"
    throughput: Callable[[int], float] | None = None
    report_peaks: bool = True
    calls: list[int] = field(default_factory=list)

    def __call__(self, batch_size: int) -> Observation:
        self.calls.append(batch_size)
        peak = self.curve(batch_size)
        if peak > self.budget_bytes:
            return Observation(batch_size, fits=False, kind=self.fail_kind)
        measured = self.curve.measure(batch_size) if isinstance(self.curve, Curve) else peak
        sps = self.throughput(batch_size) if self.throughput is not None else None
        reported = int(measured) if self.report_peaks else None
        return Observation(batch_size, fits=True, peak_bytes=reported, samples_per_second=sps)


def true_max(
    curve: Curve | Callable[[int], float], budget: int, max_batch_size: int, multiple: int = 1
) -> int | None:
    """Brute force: the largest multiple of ``multiple`` (<= ``max_batch_size``) such that it and
    every smaller candidate fit; None when the smallest candidate does not fit."""
    best: int | None = None
    for b in range(multiple, max_batch_size + 1, multiple):
        if curve(b) > budget:
            break
        best = b
    return best
