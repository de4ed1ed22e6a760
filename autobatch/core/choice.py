"""A throughput choice that noise cannot flip: what is certain first, then timings until they decide.

Pure decisions over measured step times. The tuner runs the timing probes and asks this module which
combinations are :func:`dominated` before any timing, after each round whom to time again
(:func:`needs_more`), and at the end who won and by how much (:func:`decide`). The rules (the fastest step
per probe as the statistic, a quiet probe, a busy machine, ties) are explained in docs/how-a-tune-works.md
("A throughput choice that holds").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autobatch.core.levels import less_work, work_rank
from autobatch.core.plan import plan_accumulation

__all__ = [
    "EQUIVALENT",
    "MAX_ROUNDS",
    "NOISE_Z",
    "QUIET_WAIT",
    "RSE_BOUND",
    "TIMING_SECONDS",
    "Contender",
    "Decision",
    "Timing",
    "decide",
    "dominated",
    "needs_more",
    "preference",
    "reach_beyond",
    "quiet",
]

#: Time a contender until the relative standard error of its step time (:attr:`Timing.step_time`) is at most this.
RSE_BOUND = 0.03
#: Rates closer than this many combined standard errors are a tie (about 95 % for normal errors); with
#: few samples behind an error, Student's t quantile for them instead (:data:`T_975`).
NOISE_Z = 2.0
#: Student's t two-sided 95 % quantiles by degrees of freedom: an error from 3 probes is itself uncertain.
T_975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23}
#: Rates within this fraction of each other are a tie whatever the errors (practical equivalence).
EQUIVALENT = 0.05
#: A probe whose threads waited for a core less than this share of its wall time timed the step alone: one
#: such probe is enough (docs/measurements/in-the-code.md).
QUIET_WAIT = 0.1
#: At most this many seconds of timing probes beyond the search, and this many rounds.
TIMING_SECONDS = 60.0
MAX_ROUNDS = 4


@dataclass(frozen=True)
class Contender:
    """A feasible combination and its plan, as :func:`dominated` sees it."""

    index: int  # the user's order
    precision: str
    optimizer: str
    level: str  # recomputation level (autobatch.core.levels)
    max_batch_size: int
    micro_batch_size: int  # planned
    accumulation_steps: int
    compile: bool = False


def dominated(contenders: Sequence[Contender]) -> dict[int, int]:
    """Combinations with recomputation that cannot win: ``{index: a twin that recomputes less}``.

    The twin (same precision, optimizer and compile; a level that recomputes strictly a part of this one's
    work, :func:`autobatch.core.levels.less_work`: ``off`` first) fits the recomputing one's micro-batch, so
    it can run the same plan with strictly less work per step.
    """
    out: dict[int, int] = {}
    for c in contenders:
        twins = [
            t
            for t in contenders
            if (t.precision, t.optimizer, t.compile) == (c.precision, c.optimizer, c.compile)
            and less_work(t.level, c.level)
            and _twin_runs(t.max_batch_size, c.micro_batch_size)
        ]
        if twins:  # the one that recomputes least (off before any level), then by the user's order
            out[c.index] = min(twins, key=lambda t: (work_rank(t.level), t.index)).index
    return out


def _twin_runs(twin_max: int, micro_batch_size: int) -> bool:
    """The twin without recomputation fits this micro-batch: the same plan with strictly less work."""
    return twin_max >= micro_batch_size


def reach_beyond(
    twin_max: int, global_batch_size: int | None, world_size: int, batch_multiple: int, max_batch_size: int
) -> int | None:
    """The smallest maximum (a candidate batch: a multiple of ``batch_multiple`` up to ``max_batch_size``)
    whose plan runs a larger micro-batch than ``twin_max`` (None: no maximum does).

    A combination with recomputation whose maximum stays below it plans a micro-batch its twin without
    recomputation also fits, so it can only lose: recomputation adds work and saves nothing there
    (:func:`dominated`). One probe at this batch settles whether it can win.
    The planned micro-batch never shrinks as the maximum grows, so the smallest is found by bisection.
    """
    low, high = twin_max // batch_multiple + 1, max_batch_size // batch_multiple  # in units of the multiple

    def beyond(units: int) -> bool:
        plan = plan_accumulation(units * batch_multiple, global_batch_size, world_size, batch_multiple)
        return not _twin_runs(twin_max, plan.micro_batch_size)

    if low > high or not beyond(high):
        return None
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if beyond(middle) else (middle + 1, high)
    return low * batch_multiple


@dataclass(frozen=True)
class Timing:
    """The timed steps of one contender at its planned micro-batch (a probe's first step excluded), and what
    its plan makes of them: ``accumulation_steps`` forwards and backwards, one update per global batch."""

    index: int
    micro_batch_size: int
    world_size: int
    step_seconds: tuple[float, ...]
    #: each probe's fastest timed step (its steps are in ``step_seconds``)
    probe_seconds: tuple[float, ...] = ()
    #: per probe, how long its threads waited for a core over its wall time (None: not measured)
    waits: tuple[float | None, ...] = ()
    accumulation_steps: int = 1
    #: per probe, the median of its steps' update (optimizer step, zero_grad; empty: not measured)
    update_seconds: tuple[float, ...] = ()

    @property
    def alone(self) -> bool:
        """One probe timed it, and nothing can say how load between probes would have moved it: some
        thread of it waited for a core (or that was not measured)."""
        return len(self.probe_seconds) == 1 and not (self.waits and quiet(self.waits[0]))

    @property
    def busy(self) -> bool:
        """Every probe that timed it waited for a core (:data:`QUIET_WAIT`): its rate is the load's."""
        return bool(self.waits) and all(w is not None and not quiet(w) for w in self.waits)

    @property
    def _probes(self) -> list[float]:
        return [p for p in self.probe_seconds if p > 0]

    @property
    def _basis(self) -> list[float]:
        """What :attr:`rse` is computed from: the probes' fastest steps when two probes or more timed it,
        else the fastest half of the steps (at least two)."""
        probes = self._probes
        if len(probes) > 1:
            return probes
        steps = sorted(s for s in self.step_seconds if s > 0)
        return steps[: max(2, len(steps) // 2)]

    @property
    def step_time(self) -> float:
        """The step's own cost: the mean of the probes' fastest steps (without them: the fastest step)."""
        probes = self._probes
        if probes:
            return statistics.fmean(probes)
        return min((s for s in self.step_seconds if s > 0), default=0.0)

    @property
    def update_time(self) -> float:
        """The update's part of :attr:`step_time` (0: not measured)."""
        if not self.update_seconds:
            return 0.0
        return min(statistics.fmean(self.update_seconds), self.step_time)

    @property
    def global_time(self) -> float:
        """Seconds per global batch under the plan: every micro-batch's forward and backward, one update
        (the job's loop: a probe updates after every step, a job that accumulates once per global batch)."""
        update = self.update_time
        return self.accumulation_steps * (self.step_time - update) + update

    @property
    def rate(self) -> float:
        """Samples per second over the world at :attr:`global_time` (0 without a timed step)."""
        cost = self.global_time
        samples = self.micro_batch_size * self.accumulation_steps * self.world_size
        return samples / cost if cost > 0 else 0.0

    @property
    def rse(self) -> float:
        """Relative standard error of :attr:`step_time` over :attr:`_basis` (inf below two values)."""
        basis = self._basis
        return _relative_error(basis) if len(basis) > 1 else math.inf

    @property
    def samples(self) -> int:
        """How many values :attr:`rse` is computed from (two at least)."""
        return max(2, len(self._basis))

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
    busy: bool = False  # the tie is the busy machine's: the winner's or the runner-up's probes all waited


def _relative_error(values: Sequence[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values) / math.sqrt(len(values))


def _equivalent(a: Timing, b: Timing) -> bool:
    """Within the practical-equivalence band: a tie however precise the timings."""
    return abs(a.rate - b.rate) <= EQUIVALENT * max(a.rate, b.rate)


def _within_noise(a: Timing, b: Timing, z: float) -> bool:
    if math.isinf(a.rse) or math.isinf(b.rse):
        return a.rate == b.rate
    return abs(a.rate - b.rate) <= z * math.hypot(a.rate_se, b.rate_se)


def _tied(a: Timing, b: Timing) -> bool:
    """Within the practical-equivalence band, or within the noise (Student's t for the fewer samples); or
    either was timed only on a busy machine."""
    if a.busy or b.busy:
        return True
    return _equivalent(a, b) or _within_noise(a, b, T_975.get(min(a.samples, b.samples) - 1, NOISE_Z))


def _at_edge(a: Timing, b: Timing) -> bool:
    """Within the equivalence band by less than the noise: whether it is in or out is the noise's call (the
    root tune on a quiet machine: sgd 6.5-10.5 % faster than adamw in four runs, 4.9 % in the fifth, a tie
    that went to adamw)."""
    fastest = max(a.rate, b.rate)
    if fastest <= 0:  # neither has a timed step: nothing to be at the edge of
        return False
    gap = abs(a.rate - b.rate) / fastest
    return EQUIVALENT - gap <= NOISE_Z * math.hypot(a.rse, b.rse)


def needs_more(timings: Sequence[Timing], rse_bound: float = RSE_BOUND) -> list[int]:
    """The contenders to time again, in the user's order: first every one without a timed step (its timing
    probe ran out of memory, or its steps stopped counting); then every one that one probe alone timed (its
    steps cannot show the load between probes, so its reach is unknown), unless no thread of that probe
    waited for a core; then, when some were timed quietly, those only timed on a busy machine (the load
    may have passed; when none was, more probes beside it settle nothing); then, when one is tied with
    the fastest by the noise alone (outside the equivalence band), both; else those that could still win
    whose error is above ``rse_bound``. None for a single contender, or when every contender in reach
    is within the equivalence band of the fastest by more than the noise (a tie however long they are
    timed)."""
    if len(timings) < 2:
        return []
    untimed = sorted(t.index for t in timings if t.rate <= 0)
    if untimed:  # no timed step (its timing probe ran out of memory, or its steps no longer count): time it
        return untimed
    once = sorted(t.index for t in timings if t.alone)
    if once:  # one probe's steady steps say nothing of the load between probes: no one is out of reach yet
        return once
    measured = [t for t in timings if not t.busy]
    if not measured:  # a busy machine throughout: more probes beside the same load would not settle it
        return []
    if len(measured) < len(timings):  # some timed quietly: the load may have passed, time the others again
        return sorted(t.index for t in timings if t.busy)
    best = max(measured, key=lambda t: t.rate)
    reach = [t for t in measured if t is best or _tied(t, best) or _within_noise(t, best, NOISE_Z)]
    if len(reach) < 2:
        return []
    # Tied with the fastest by the noise alone, not by the equivalence band, or within the band by less than
    # the noise: more probes can settle it.
    unsettled = [
        t
        for t in reach
        if t is not best and _tied(t, best) and (not _equivalent(t, best) or _at_edge(t, best))
    ]
    if unsettled:
        return sorted({best.index, *(t.index for t in unsettled)})
    return sorted(t.index for t in reach if t.rse > rse_bound and not _equivalent(t, best))


def decide(timings: Sequence[Timing], order: Mapping[int, Any] | None = None) -> Decision | None:
    """The fastest contender, ties within the noise going to the first in ``order`` (a sort key per index:
    :func:`preference`; without it, the user's order). None without a timed contender."""
    measured = [t for t in timings if t.rate > 0]
    if not measured:
        return None
    rank = order or {}
    best = max(measured, key=lambda t: (t.rate, -t.index))
    winner = min(
        (t for t in measured if t is best or _tied(t, best)), key=lambda t: rank.get(t.index, t.index)
    )
    others = [t for t in measured if t is not winner]
    if not others:
        return Decision(winner.index, None, None, False, winner.rse)
    runner = max(others, key=lambda t: (t.rate, -t.index))
    margin = winner.rate / runner.rate - 1 if runner.rate > 0 else None
    busy = winner.busy or runner.busy
    return Decision(winner.index, runner.index, margin, _tied(winner, runner), winner.rse, busy)


def preference(contenders: Sequence[Contender]) -> dict[int, tuple[int, float, int]]:
    """Who wins a tie: the user's order of precision, optimizer and compile, and within one such group the
    least recomputation (:func:`autobatch.core.levels.work_rank`: recomputation that buys no measurable
    throughput is not worth its wrapper in the job), then the user's order."""
    first: dict[tuple[str, str, bool], int] = {}
    for c in sorted(contenders, key=lambda c: c.index):
        first.setdefault((c.precision, c.optimizer, c.compile), c.index)
    return {
        c.index: (first[(c.precision, c.optimizer, c.compile)], work_rank(c.level), c.index)
        for c in contenders
    }


def quiet(wait: float | None) -> bool:
    """Whether a probe whose threads waited for a core ``wait`` of its wall time timed the step alone."""
    return wait is not None and wait < QUIET_WAIT
