"""A throughput choice that noise cannot flip: what is certain first, then timings until they decide.

Pure decisions over measured step times; the tuner runs the timing probes (interleaving the
contenders, so that a neighbour's burst of load hits them all alike) and asks this module, after each
round, whom to time again and, at the end, who won and by how much.

* **Certain without measuring.** At equal micro-batch and accumulation, activation recomputation only
  adds work (the checkpointed forward runs twice). A combination with recomputation is therefore never
  preferred to the same precision and optimizer without it when that one fits the micro-batch:
  :func:`dominated` drops it before any timing.
* **Enough steps.** A contender's rate is its micro-batch (times the world size) over its mean step
  time; its relative standard error is the step times' standard deviation over their mean over
  ``sqrt(n)``, or, when it was timed by two probes or more, the same over the probes' mean step times
  if that is larger: a probe's steps share one stretch of the machine's load, so on a busy machine they
  vary less among themselves than between probes, and their own error understates the noise.
  :func:`needs_more` names every contender one probe alone timed, then those still in contention whose
  error is above the bound; the tuner times them again until none is, or its time cap is spent.
* **Ties.** Two rates within :data:`NOISE_Z` combined standard errors of each other are a tie; ties go
  to the user's order (the lower index). :func:`decide` reports the winner's margin over the runner-up
  and whether that margin is within the noise.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "MAX_ROUNDS",
    "NOISE_Z",
    "RSE_BOUND",
    "TIMING_SECONDS",
    "Contender",
    "Decision",
    "Timing",
    "decide",
    "dominated",
    "needs_more",
]

#: Time a contender until the relative standard error of its mean step time is at most this.
RSE_BOUND = 0.03
#: Rates closer than this many combined standard errors are a tie (about 95 % for normal errors).
NOISE_Z = 2.0
#: At most this many seconds of timing probes beyond the search, and this many rounds.
TIMING_SECONDS = 60.0
MAX_ROUNDS = 4


@dataclass(frozen=True)
class Contender:
    """A feasible combination and its plan, as :func:`dominated` sees it."""

    index: int  # the user's order
    precision: str
    optimizer: str
    recompute: bool
    max_batch_size: int
    micro_batch_size: int  # planned
    accumulation_steps: int


def dominated(contenders: Sequence[Contender]) -> dict[int, int]:
    """Combinations with recomputation that cannot win: ``{index: the twin without recomputation}``.

    The twin (same precision and optimizer, no recomputation) fits the recomputing one's micro-batch,
    so it can run the same plan with strictly less work per step.
    """
    twins = {(c.precision, c.optimizer): c for c in contenders if not c.recompute}
    out: dict[int, int] = {}
    for c in contenders:
        twin = twins.get((c.precision, c.optimizer))
        if c.recompute and twin is not None and twin.max_batch_size >= c.micro_batch_size:
            out[c.index] = twin.index
    return out


@dataclass(frozen=True)
class Timing:
    """The timed steps of one contender at its planned micro-batch (a probe's first step excluded)."""

    index: int
    micro_batch_size: int
    world_size: int
    step_seconds: tuple[float, ...]
    #: each probe's mean step time (its steps are in ``step_seconds``); two or more widen :attr:`rse`
    probe_seconds: tuple[float, ...] = ()

    @property
    def rate(self) -> float:
        """Samples per second over the world (0 without a timed step)."""
        steps = [s for s in self.step_seconds if s > 0]
        return self.micro_batch_size * self.world_size / statistics.fmean(steps) if steps else 0.0

    @property
    def rse(self) -> float:
        """Relative standard error of the mean step time (inf below two steps): over the steps, or over
        the probes' means when two probes or more timed it and that is larger."""
        steps = [s for s in self.step_seconds if s > 0]
        if len(steps) < 2:
            return math.inf
        probes = [p for p in self.probe_seconds if p > 0]
        return max(_relative_error(steps), _relative_error(probes) if len(probes) > 1 else 0.0)

    @property
    def rate_se(self) -> float:
        """Standard error of :attr:`rate` (to first order, the rate times the relative error)."""
        return self.rate * self.rse


@dataclass(frozen=True)
class Decision:
    """Who won the throughput choice, over whom, by how much."""

    winner: int
    runner_up: int | None
    margin: float | None  # winner's rate over the runner-up's, less 1 (negative: a tie went to order)
    tie: bool  # the runner-up is within the noise: the user's order decided
    rse: float  # the winner's relative standard error


def _relative_error(values: Sequence[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values) / math.sqrt(len(values))


def _tied(a: Timing, b: Timing) -> bool:
    if math.isinf(a.rse) or math.isinf(b.rse):
        return a.rate == b.rate
    return abs(a.rate - b.rate) <= NOISE_Z * math.hypot(a.rate_se, b.rate_se)


def needs_more(timings: Sequence[Timing], rse_bound: float = RSE_BOUND) -> list[int]:
    """The contenders to time again, in the user's order: first every one that one probe alone timed (its
    steps cannot show the load between probes, so its reach is unknown), then those that could still win
    (within the noise of the fastest) whose error is above ``rse_bound``. None for a single contender."""
    if len(timings) < 2:
        return []
    once = sorted(t.index for t in timings if len(t.probe_seconds) == 1)
    if once:  # one probe's steady steps say nothing of the load between probes: no one is out of reach yet
        return once
    best = max(timings, key=lambda t: t.rate)
    reach = [t for t in timings if t is best or _tied(t, best) or t.rate + NOISE_Z * t.rate_se >= best.rate]
    if len(reach) < 2:
        return []
    return sorted(t.index for t in reach if t.rse > rse_bound)


def decide(timings: Sequence[Timing]) -> Decision | None:
    """The fastest contender, ties within the noise going to the user's order (None without one)."""
    measured = [t for t in timings if t.rate > 0]
    if not measured:
        return None
    best = max(measured, key=lambda t: (t.rate, -t.index))
    winner = min((t for t in measured if t is best or _tied(t, best)), key=lambda t: t.index)
    others = [t for t in measured if t is not winner]
    if not others:
        return Decision(winner.index, None, None, False, winner.rse)
    runner = max(others, key=lambda t: (t.rate, -t.index))
    margin = winner.rate / runner.rate - 1 if runner.rate > 0 else None
    return Decision(winner.index, runner.index, margin, _tied(winner, runner), winner.rse)
