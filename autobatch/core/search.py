"""The exact largest batch size that fits, found in a handful of probes.

:func:`search_max_batch` is a pure function over a probe callable ("does batch b fit?"): the answer is
decided by feasibility alone, and a model of peak memory against batch size only proposes where to probe,
so a wrong model costs probes, never correctness. :func:`probe_bound` is its worst case. The bracket, the
model-guided and fallback steps and the bound are explained in docs/how-a-tune-works.md ("The search,
precisely").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Literal

from autobatch.core import endgame
from autobatch.core.model import Affine, Prediction, gap_jitter, model_points, predict, reported_model

__all__ = [
    "KINDS",
    "SLACK",
    "Affine",
    "Guidance",
    "Observation",
    "ProbeFn",
    "SearchResult",
    "SearchStatus",
    "probe_bound",
    "search_max_batch",
]

#: Observation kinds; every kind but "fits" means: does not fit.
KINDS: tuple[str, ...] = ("fits", "oom", "crash", "timeout")
SearchStatus = Literal["exact", "capped", "infeasible", "pruned", "incomplete"]

#: How many probes the model may cost beyond the doubling-then-bisection schedule. With 2, a model a few
#: samples high near the boundary spent its slack on misses one candidate apart and the search fell back to
#: bisecting the whole bracket from its fitting end (a line whose fits read up to 3 samples low and whose
#: misses stop at the line: 8, 117, 92, 91, then 49, 70, 80, 85, 88, 89, 90; with 3: 8, 117, 92, 91, 90).
SLACK = 3
#: A bracket this many times wider than its fitting end (after the model overshot) is split at its
#: geometric middle: an extrapolation errs by a factor there, not by an amount.
GEOMETRIC_RATIO = 32
#: A line through the first two fits that reaches further than this times the larger one is tested halfway
#: (geometrically) before it is believed. On the quadratic workload (a batch x batch loss) 8 and 1296 drew the
#: boundary at 6616 (the maximum was 3143), and 8 and 1846 at 4991 (3142), 8 and 1920 at 4914 (3169): each
#: failed at once, and two of those tunes took 9 probes; on the benchmark's other workloads the line reached
#: 1.05-1.22x past its larger fit (mlp, cnn, gpt, lstm, vit_small), and 2.2-2.6x on param_heavy. Those three
#: tunes replayed (2026-11-30): 8, 6 and 7 probes. The rule holds for a line through the rising readings too
#: (2026-12-01): the quadratic workload's reading lies 0.1 MB above its peak, and which one the line follows
#: turned on that noise (8, 935 and then 8696, out of memory at once).
FAR_REACH = 2.5
#: The same after a miss that ran out of memory in its first step with no peak: an allocation failed, the
#: curve passed the cap by more than the margin, far from the line the model drew (docs/how-a-tune-works.md).
#: With 4, the quadratic workload's miss at 4991 over a fit at 1846 (2.7x) was split at 3418, which failed at
#: once too, then 2632 fitted; the geometric middle, 3035, fits.
FAR_MISS_RATIO = 2
#: A line's boundary this little (relatively) under a known fit is that fit's, rounded: a fit whose peak met the
#: budget exactly (28.999999999999964 for a fit at 29 drew the search to the cap and back, a sixth probe).
ROUNDING = 1e-9
#: An end-game probe is judged by the work it cuts on average over its outcomes, rather than by its likelier
#: outcome's, when its candidate is the maximum with at least this probability: a confirmation a sample under a
#: miss on the quadratic workload (0.37-0.45 there); a noisy line's (2 % noise) reads 0.27 and misses. With 0.35,
#: 13 of 100 seeded quadratic tunes took seven probes (none with 0.3).
ANSWER = 0.3


@dataclass(frozen=True)
class Observation:
    """The outcome of one probe. A non-fit built with the default kind is recorded as "oom"."""

    batch_size: int
    fits: bool
    #: The measured peak when it fits (None if unknown); when it does not, the peak of the step at which it
    #: stopped, past the search's line (a lower bound of its peak; None for an allocation that failed).
    peak_bytes: int | None = None
    kind: str = "fits"  # "fits" | "oom" | "crash" | "timeout"
    samples_per_second: float | None = None
    steps: int = 0  # full training steps the probe ran (0: unknown)
    #: The peak of the batch-dependent phase alone (forward and backward with the optimizer state
    #: resident), when the probe could tell it from the optimizer step's (None: unknown). A probe that
    #: ran out of memory after its first backward has one too: a point above the budget.
    rising_bytes: int | None = None
    #: What the probe itself measured of memory that does not scale with the batch: its process before
    #: building, the parameters, their gradients and the optimizer state (None: unknown). A fit's reading
    #: less this is the batch's own share, so the guess after the first fit needs no other figure.
    static_bytes: int | None = None

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


@dataclass(frozen=True)
class Guidance:
    """What tells :func:`search_max_batch` where and how to probe, never what the answer is: with any
    guidance (or none) the search finds the same exact maximum within :func:`probe_bound` probes; good
    guidance finds it in fewer.

    ``prior`` predicts the peak curve (e.g. from another combination). ``start``: the first batch when
    nothing is known and there is no prior (default: the smallest candidate, which on real devices says
    little about the per-sample cost; a first probe anywhere keeps the bound). ``floor_bytes``: memory
    known not to scale with the batch; the guess after the first fit scales what lies above it (a bound of
    an affine curve's maximum), or until a miss, above the fit's own :attr:`Observation.static_bytes`
    (nearer, no bound). ``final_probe``: how to probe a candidate the model predicts to be the maximum
    itself (say, as long as a confirmation, so that a right prediction needs no separate one; default the
    search's ``probe``; the end game's too). ``long_steps``: a fit of at least this many steps needs no
    confirmation (:mod:`autobatch.core.endgame`).
    """

    prior: Affine | None = None
    start: int | None = None
    floor_bytes: int = 0
    final_probe: ProbeFn | None = None
    long_steps: int | None = None


def search_max_batch(
    probe: ProbeFn,
    *,
    budget_bytes: int,
    max_batch_size: int,
    batch_multiple: int = 1,
    known: Iterable[Observation] = (),
    prune_at_or_below: int | None = None,
    max_probes: int | None = None,
    guidance: Guidance = Guidance(),
) -> SearchResult:
    """Find the largest multiple of ``batch_multiple`` (<= ``max_batch_size``) that fits.

    ``probe(b)`` runs batch ``b`` and returns an :class:`Observation`. ``known`` observations
    (a cache, an earlier run) count as probed and may be at any batch size. ``prune_at_or_below``: stop
    ("pruned") as soon as a batch at or below it is known not to fit, and probe the largest candidate at
    or below it early to find out; pass the best maximum so far to skip combinations that cannot reach
    it, or that maximum + 1 to skip those that can at best tie. ``max_probes``: stop ("incomplete") after
    that many new probes. ``guidance`` (:class:`Guidance`: a prior, the first batch, the floor of static
    memory, how to probe a predicted maximum) changes which batches are probed, never the answer. At most
    :func:`probe_bound` probes are made.
    """
    _check_inputs(budget_bytes, max_batch_size, batch_multiple, prune_at_or_below, max_probes)
    m, n, known_obs = batch_multiple, max_batch_size // batch_multiple, tuple(known)
    prior, final_probe, long_steps = guidance.prior, guidance.final_probe, guidance.long_steps
    trace: list[Observation] = []
    primed = prior.of_readings if prior is not None else None
    debt, remaining = 0, None  # type: int, int | None
    # distrust: the model said "fits" and the probe did not: ignore it until a new fit; refuted: the last did
    distrust = refuted = False
    while True:
        state = _State.of(known_obs + tuple(trace), m, n, long_steps, budget_bytes, primed)
        if trace and not trace[-1].fits:
            # Unless the miss became a point of the model (a reading that changes it): the same model would
            # say "fits" a candidate lower, and the search would creep down a sample a probe.
            distrust = (distrust or refuted) and trace[-1].batch_size not in state.points
        status = state.status(prune_at_or_below)
        if status is None and max_probes is not None and len(trace) >= max_probes:
            status = "incomplete"
        if status is not None:
            return state.result(status, trace, prior, budget_bytes)
        now = state.remaining()
        # Not floored at zero: a probe that cuts the remaining work by more than one banks the rest, and the
        # bound holds all the same (docs/how-a-tune-works.md, "Worst case").
        debt = debt if remaining is None else debt + 1 - (remaining - now)
        remaining = now
        guide = (prior, budget_bytes, prune_at_or_below, not distrust, guidance.floor_bytes)
        guided = state.guided(*guide) if debt < SLACK else None
        index, expect_fit, final = guided or state.unguided(guidance.start)
        batch = (index + 1) * m
        obs = _checked((final_probe if final and final_probe is not None else probe)(batch), batch)
        trace.append(obs)
        refuted, distrust = expect_fit is True and not obs.fits, distrust and not obs.fits


def _checked(obs: object, batch: int) -> Observation:
    if not isinstance(obs, Observation) or obs.batch_size != batch:
        raise ValueError(f"probe({batch}) must return an Observation for batch {batch}, got {obs!r}")
    return obs


@dataclass(frozen=True)
class _State:
    """The bracket in index space, derived from every observation so far."""

    lo: int
    hi: int
    n: int
    m: int
    min_fail: int | None
    points: dict[int, int]  # consistent fitting batches -> peak (the larger if measured twice)
    lo_confirmed: bool = False  # the fitting end ran as long as a confirmation
    of_readings: bool = False  # the points are the rising phase's readings plus the gap
    static: int | None = None  # the fits' own static memory (the largest measured), while no non-fit is known
    far_miss: bool = False  # the smallest non-fit ran out of memory in its first step, with no peak
    jitter: int = 0  # how far the peaks near the line moved against their readings (model.gap_jitter)

    @classmethod
    def of(
        cls,
        observations: tuple[Observation, ...],
        m: int,
        n: int,
        long_steps: int | None = None,
        line: int = 0,
        primed: bool | None = None,
    ) -> _State:
        min_fail = min((o.batch_size for o in observations if not o.fits), default=None)
        fits = [o for o in observations if o.fits and (min_fail is None or o.batch_size < min_fail)]
        misses = [(o.batch_size, o.peak_bytes, o.rising_bytes) for o in observations if not o.fits]
        points, phased = model_points(
            [(o.batch_size, o.peak_bytes, o.rising_bytes) for o in fits], misses, line, primed
        )
        top = max((o.batch_size for o in fits), default=0)
        lo = min(top // m, n) - 1
        hi = n if min_fail is None else min(-(-min_fail // m) - 1, n)
        confirmed = long_steps is not None and any(
            o.batch_size == top and o.steps >= long_steps for o in fits
        )
        static = max((o.static_bytes for o in fits if o.static_bytes), default=None)
        far = any(
            o.batch_size == min_fail and o.kind == "oom" and o.peak_bytes is None and o.steps == 0
            for o in observations
        )
        readings = [(o.batch_size, o.peak_bytes, o.rising_bytes) for o in fits]
        jitter = gap_jitter(readings, misses, line) if phased else 0
        static = static if min_fail is None else None
        return cls(lo, hi, n, m, min_fail, points, confirmed, phased, static, far, jitter)

    def result(
        self, status: SearchStatus, trace: list[Observation], prior: Affine | None, budget: int
    ) -> SearchResult:
        best = (self.lo + 1) * self.m if self.lo >= 0 else None
        model = reported_model(self.points, prior, self.min_fail, budget)
        model = replace(model, of_readings=self.of_readings) if model is not None else None
        return SearchResult(best, status, tuple(trace), self.min_fail, model)

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

    def unguided(self, start: int | None) -> tuple[int, None, bool]:
        """The scout candidate while nothing is known, else doubling then bisection."""
        if start is not None and self.lo < 0 and self.hi == self.n:
            return min(max(start // self.m, 1), self.n) - 1, None, False
        return self.fallback(), None, False

    def guided(
        self,
        prior: Affine | None,
        budget: int,
        prune_at_or_below: int | None,
        use_model: bool,
        floor: int = 0,
    ) -> tuple[int, bool | None, bool] | None:
        """A model-guided step: (index, whether the model expects it to fit, whether it predicts that
        candidate to be the maximum), or None."""
        step = self._fromreported_model(prior, budget, floor) if use_model else self._geometric()
        if prune_at_or_below is not None:
            # One probe at the largest candidate <= the threshold settles whether pruning applies.
            edge = prune_at_or_below // self.m - 1
            if self.lo < edge < self.hi and (step is None or step[0] < edge):
                return edge, None, False
        return step

    def _fromreported_model(
        self, prior: Affine | None, budget: int, floor: int = 0
    ) -> tuple[int, bool, bool] | None:
        """Probe the largest candidate the model says fits, else the smallest it says does not,
        if that probe, should the model be right, cuts the remaining work as much as a fallback."""
        prediction = predict(self.points, prior, self.min_fail, budget, floor, self.static)
        if prediction is None or prediction.high < (self.lo + 1) * self.m * (1 - ROUNDING):
            # None, or refuted by a known fit: it puts the boundary under the bracket's fitting end (not by the
            # rounding of its arithmetic, which puts a fit whose peak met the budget exactly a hair above it)
            return None
        # The end game reads the model's noise: a line through two points alone has none to read.
        planned = len(self.points) >= 3 or prior is not None
        # A curve that bends, in a bracket wider than the end game's window: the likelier end of the interval
        # first, as long as a confirmation (below); nearer, the end game plans.
        convex = prediction.bends and self.hi - self.lo > endgame.WIDTH
        if 0 <= self.lo and self.hi - self.lo >= 2 and prediction.reported and planned and not convex:
            step = self._endgame(prediction, budget)
            if step is not None:
                return step
        middle = self._reach_middle(prediction) if prior is None else None
        if middle is not None:
            return middle, True, False
        low = min(self._index_at_or_below(prediction.low), self.hi - 1)
        high = max(self._index_at_or_below(prediction.high) + 1, self.lo + 1)
        if low > self.lo and (self.remaining() - replace(self, lo=low).remaining() >= 1 or convex):
            # The model's own answer: it fits and the next candidate does not (a lower bound, such as
            # the proportional guess, is never one). On a convex stretch (a batch-by-batch loss) the line
            # overshoots and the interval's low end is the likelier maximum: it is probed first, as long as a
            # confirmation, even where it cuts no bisection step (probing the line's end first cost three
            # probes; the debt still bounds the worst case).
            return low, True, prediction.reported and (high == low + 1 or convex)
        if high < self.hi and self.remaining() - replace(self, hi=high).remaining() >= 1:
            # The first candidate the model says does not fit, right above a one-candidate interval: should
            # it fit after all, it is the maximum but for noise (the gpt example: boundary 41.97, batch 42
            # fitted 3 steps, 43 did not, and 42 ran again for its confirmation). A miss stops at its
            # crossing step whatever its length.
            return high, False, prediction.reported and high == low + 1
        return None

    def _reach_middle(self, prediction: Prediction) -> int | None:
        """A line through two fits that puts the boundary more than :data:`FAR_REACH` times beyond the larger
        one says little of a curve that bends: the geometric middle, a fit there the third point that shows the
        bend. Only where the fits reported their own static memory: the second probe then aimed at an affine
        curve's boundary (on the benchmark's workloads from 3 % above it to 60 % below:
        :data:`~autobatch.core.model.LIKELY_SHORT`), and a line reaching more than :data:`FAR_REACH` times past it
        contradicts the curve it aimed at; a guess scaled from nothing is only a
        lower bound, and a long reach past it is no news. None: the reach is short, more points drew it (and the caller passes over it where a prior did)."""
        top = (self.lo + 1) * self.m
        if len(self.points) != 2 or self.static is None or not prediction.reported:
            return None
        if not prediction.low > FAR_REACH * top:
            return None
        middle = math.isqrt(int(top * prediction.low)) // self.m - 1
        return middle if self.lo < middle < self.hi else None

    def _endgame(self, prediction: Prediction, budget: int) -> tuple[int, bool, bool] | None:
        """Near the model's boundary, the probe with the fewest expected probes left (:mod:`endgame`)."""
        proposal = endgame.propose(
            endgame.Bracket(self.lo, self.hi, self.n, self.m, self.lo_confirmed),
            self.points,
            prediction,
            budget,
            self.jitter,
        )
        if proposal is None:
            return None
        # As for any model-guided step: the probe must cut the remaining work, here by one at least on average
        # over its outcomes (else the model's own step or a fallback does better). Not its likelier outcome alone:
        # a miss a sample over the boundary with the fitting end far below leaves the bisection's count as it was,
        # a fit there ends it (the quadratic workload: 3166 as long as a confirmation over 2826 and a miss at
        # 3168, turned down for a 3-step probe at 3165 and a seventh probe).
        index, now, chance = proposal.index, self.remaining(), proposal.fit_chance
        fits, misses = replace(self, lo=index).remaining(), replace(self, hi=index).remaining()
        if self.hi == self.n or proposal.answer_chance < ANSWER:
            # The likelier outcome decides where the candidate is not likely the answer (:data:`ANSWER`), and with
            # no miss known, where a first miss cuts the doubling's count by half whatever its chance (averaged, a
            # noisy line's end game drew a confirmation the model then distrusted, and the search doubled from it:
            # 16 probes where 6 did).
            chance = 1.0 if chance >= 0.5 else 0.0
        if now - chance * fits - (1 - chance) * misses < 1:
            return None
        return index, proposal.line_says_fits, proposal.final

    def _geometric(self) -> tuple[int, None, bool] | None:
        """After the model overshot by a wide factor, the geometric middle of the bracket: an extrapolation
        errs by a factor, not by an amount (counted as a guided step, so the bound holds)."""
        low, high = self.lo + 1, self.hi + 1  # batch sizes in units of the multiple
        ratio = FAR_MISS_RATIO if self.far_miss else GEOMETRIC_RATIO
        if self.lo < 0 or self.hi >= self.n or high < ratio * low:
            return None
        middle = math.isqrt(low * high) - 1
        return (middle, None, False) if self.lo < middle < self.hi else None

    def _index_at_or_below(self, batch: float) -> int:
        """Index of the largest candidate <= batch (-1 if none, n if beyond the last)."""
        if batch >= (self.n + 1) * self.m:
            return self.n
        if batch < self.m:
            return -1
        return math.floor(batch / self.m) - 1


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
