"""One combination's maximum: calibrate the prior, search, confirm. Pure, over a probe callable.

:func:`find_maximum` is the whole per-combination procedure that ``tune`` runs for every combination of the
grid and ``explain --verify`` runs for every lever; it talks to a :data:`ProbeCall` and never to a device.
The three steps (a calibration probe at :data:`CALIBRATE_AT` when the slope is a guess, the search from the
scout candidate, a confirmation that is searched below at most :data:`CONFIRM_ROUNDS` times, else
``incomplete``): docs/how-a-tune-works.md ("Search").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from autobatch.core.model import Affine
from autobatch.core.reuse import Prediction
from autobatch.core.search import Guidance, Observation, SearchStatus, search_max_batch
from autobatch.core.space import optimizer_state_bytes
from autobatch.core.step_peaks import CONFIRM_STEPS_AT_LEAST
from autobatch.core.units import format_bytes

#: Where the calibration probe goes, as a fraction of the boundary a guessed slope predicts: guesses for
#: another precision or recomputation setting run too high (docs/measurements/in-the-code.md).
CALIBRATE_AT = 0.8
#: How many times a maximum that fails its confirmation is searched again below.
CONFIRM_ROUNDS = 4
#: Without a prior, the first probe is the 8th candidate, not the 1st: at the smallest batch the fixed
#: memory and its noise hide the per-sample cost (docs/measurements/in-the-code.md).
SCOUT_CANDIDATES = 8

#: ``probe(batch, (min_steps, max_steps), purpose)``; purpose is "search" or "confirm".
ProbeCall = Callable[[int, tuple[int, int], str], Observation]


@dataclass(frozen=True)
class Limits:
    """The candidates and the probe lengths (from the settings; defaults live there only)."""

    max_batch_size: int
    batch_multiple: int
    steps: int
    max_steps: int
    confirm_steps: int

    @property
    def search_steps(self) -> tuple[int, int]:
        return (self.steps, self.max_steps)

    @property
    def confirm(self) -> tuple[int, int]:
        """A confirmation's steps: the leak rule's six at least, then up to ``confirm_steps`` while the peak
        still grows. Once a step's peak holds still, the steps after it repeat it (the optimizer state exists
        from the first step, and a step keeps nothing across steps); a leak grows at every step and runs on.
        Never fewer than a search probe's ``steps``: what a user asked every probe to see (a script that
        unfreezes after N steps, tuned with ``--steps`` above N), its confirmation sees too."""
        return (max(self.steps, min(CONFIRM_STEPS_AT_LEAST, self.confirm_steps)), self.confirm_steps)

    def confirms(self, observation: Observation) -> bool:
        """Whether a fit ran as long as a confirmation (at least its least steps; 0: unknown)."""
        return observation.fits and observation.steps >= self.confirm[0]


@dataclass(frozen=True)
class StaticMemory:
    """Memory that does not grow with the batch, by category (bytes)."""

    parameters: int
    gradients: int
    optimizer_state: int

    @classmethod
    def analytic(
        cls, precision: str, optimizer: str, shapes: list[tuple[int, ...]], count: int
    ) -> StaticMemory:
        """From the parameters' shapes: ``count`` parameters of the precision's size, as many gradients,
        and the optimizer's states (:func:`autobatch.core.space.optimizer_state_bytes`)."""
        elem = 2 if precision == "bf16-true" else 4
        params = count * elem
        return cls(params, params, optimizer_state_bytes(optimizer, shapes, elem))

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state

    def to_dict(self) -> dict[str, int]:
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer_state": self.optimizer_state,
        }


@dataclass(frozen=True)
class Attempt:
    """One probe the procedure made, and why."""

    observation: Observation
    purpose: str  # "search" | "confirm"


@dataclass(frozen=True)
class Maximum:
    """A combination's answer. ``status`` as :class:`~autobatch.core.search.SearchResult`'s; for
    ``incomplete``, ``max_batch_size`` is the largest batch whose confirmation held (None if none)."""

    max_batch_size: int | None
    status: SearchStatus
    upper_bound: int | None  # smallest batch known not to fit
    model: Affine | None
    attempts: tuple[Attempt, ...]
    notes: tuple[str, ...] = ()

    @property
    def probes(self) -> int:
        return len(self.attempts)


class _ShortFitsRefuted(Exception):
    """A batch did not fit at or below one that fitted a shorter probe: the search restarts, trusting only
    probes as long as a confirmation (:attr:`_Run.long`)."""


@dataclass
class _Run:
    """The probes of one procedure, and what they proved."""

    probe: ProbeCall
    limits: Limits
    attempts: list[Attempt] = field(default_factory=list)
    misses: set[int] = field(default_factory=set)  # did not fit, confirmations included
    confirmed: set[int] = field(default_factory=set)  # fitted a probe as long as a confirmation
    fitted: set[int] = field(default_factory=set)  # fitted a probe of any length
    known: Sequence[Observation] = ()  # measured before this run (not attempts): what they proved counts
    #: Set by the first miss at or below a batch that fitted (a failed confirmation, a boundary that
    #: flickers, memory that grows past the search's steps): from then on every probe runs as long as a
    #: confirmation, and only such fits count.
    long: bool = False

    def __post_init__(self) -> None:
        for observation in self.known:
            self.learn(observation)

    def __call__(self, batch: int, steps: tuple[int, int], purpose: str) -> Observation:
        observation = self.probe(batch, steps, purpose)
        self.attempts.append(Attempt(observation, purpose))
        self.learn(observation)
        return observation

    def learn(self, observation: Observation) -> None:
        if observation.fits:
            self.fitted.add(observation.batch_size)
            if self.limits.confirms(observation):
                self.confirmed.add(observation.batch_size)
            return
        self.misses.add(observation.batch_size)
        self.long = self.long or any(b >= observation.batch_size for b in self.fitted)

    def evidence(self) -> list[Observation]:
        """What the next search starts from: every observation, or, once :attr:`long`, the misses and the
        fits as long as a confirmation."""
        seen = [*self.known, *(a.observation for a in self.attempts)]
        return [o for o in seen if not self.long or not o.fits or self.limits.confirms(o)]

    def search_probe(self, batch: int) -> Observation:
        # Next to a known non-fit, a fit is the answer: run it as long as the confirmation, so that it
        # needs none (an out-of-memory step comes early, so a miss costs little more). Two under one, a fit
        # is the answer or the one candidate above is, which runs as long (next to the miss): as long, it
        # needs no confirmation whichever fits (as_is/loader_workers.py: after misses at 7188 and 7187 a
        # 3-step fit at 7185, 7186 missed, and 7185 ran again as a confirmation, a ninth probe).
        m = self.limits.batch_multiple
        near_miss = batch + m in self.misses or batch + 2 * m in self.misses
        return self._searching(
            batch, self.limits.confirm if near_miss or self.long else self.limits.search_steps
        )

    def final_probe(self, batch: int) -> Observation:
        # The model predicts this batch to be the maximum: probe it as long as a confirmation, so that a
        # right prediction needs no separate one (a wrong one costs the extra steps, never an answer).
        return self._searching(batch, self.limits.confirm)

    def _searching(self, batch: int, steps: tuple[int, int]) -> Observation:
        was_long = self.long
        observation = self(batch, steps, "search")
        if self.long and not was_long:
            raise _ShortFitsRefuted
        return observation


def find_maximum(
    probe: ProbeCall,
    *,
    budget_bytes: int,
    limits: Limits,
    prediction: Prediction | None = None,
    floor_bytes: int = 0,
    prune_at_or_below: int | None = None,
    known: Sequence[Observation] = (),
) -> Maximum:
    """The exact largest batch of one combination, confirmed (see the module docstring).

    ``prediction``: the line other combinations predict (None: search from the scout candidate).
    ``floor_bytes``: peak memory known not to grow with the batch (a lower bound of the intercept).
    ``prune_at_or_below``: stop as soon as a batch at or below it is known not to fit (status
    ``pruned``): the combination cannot beat the best maximum so far. ``known``: earlier answers.
    """
    run = _Run(probe, limits, known=known)
    try:
        prior, _ = calibrate(prediction, run.search_probe, budget_bytes, limits, prune_at_or_below)
    except _ShortFitsRefuted:
        prior = None
    notes: list[str] = []
    result = None
    for _round in range(CONFIRM_ROUNDS + 1):
        try:
            result = search_max_batch(
                run.search_probe,
                budget_bytes=budget_bytes,
                max_batch_size=limits.max_batch_size,
                batch_multiple=limits.batch_multiple,
                known=run.evidence(),
                prune_at_or_below=prune_at_or_below,
                guidance=Guidance(
                    prior=prior,
                    start=SCOUT_CANDIDATES * limits.batch_multiple,
                    floor_bytes=floor_bytes,
                    final_probe=run.final_probe,
                    long_steps=limits.confirm[0],
                ),
            )
        except _ShortFitsRefuted:
            notes.append(_refuted(run))
            continue
        best = result.max_batch_size
        done = best is None or result.status == "pruned" or best in run.confirmed
        if not done and _round < CONFIRM_ROUNDS:
            assert best is not None
            done = run(best, limits.confirm, "confirm").fits
            if not done:
                # The short fits no longer count as proof, but the line they drew still says where the
                # maximum lies: the search below starts from it (a creep over the line: the candidate under).
                prior = result.model or prior
                notes.append(
                    f"batch {best} fitted {limits.steps}+ steps but not its confirmation (up to "
                    f"{limits.confirm_steps}); searched below it, every probe as long as a confirmation"
                )
        if done:
            return Maximum(
                best, result.status, result.upper_bound, result.model, tuple(run.attempts), tuple(notes)
            )
    upper = min(run.misses, default=None)
    held = max((b for b in run.confirmed if upper is None or b < upper), default=None)
    notes.append(
        f"the maximum's confirmation failed {CONFIRM_ROUNDS} times; the largest batch whose confirmation held "
        f"is {held}"
        if held
        else f"the maximum's confirmation failed {CONFIRM_ROUNDS} times; none held"
    )
    model = result.model if result is not None else None
    return Maximum(held, "incomplete", upper, model, tuple(run.attempts), tuple(notes))


def _refuted(run: _Run) -> str:
    miss = run.attempts[-1].observation.batch_size
    above = min(b for b in run.fitted if b >= miss)
    return (
        f"batch {miss} did not fit a probe of {run.attempts[-1].observation.steps or 'its'} steps after batch "
        f"{above} fitted a shorter one (memory that grows past the search's steps, or a boundary that flickers): "
        "searched again, every probe as long as a confirmation"
    )


def calibrate(
    prediction: Prediction | None,
    probe: Callable[[int], Observation],
    budget_bytes: int,
    limits: Limits,
    settles: int | None = None,
) -> tuple[Affine | None, list[Observation]]:
    """Turn a prediction into the search's prior, spending one probe when its slope is only a guess.

    A guessed slope is the weak half of the line; the intercept is the strong one. So probe below
    where the guess puts the boundary, where a guessed slope usually still fits: a fit gives the slope
    from the intercept over most of the range; a miss at the guess itself would only bound it. Not below
    ``settles``, the batch that settles whether the combination can win at all (the search would probe
    it next): where the guess puts the boundary under it, one probe there likely ends the combination.
    """
    if prediction is None:
        return None, []
    line = Affine(prediction.intercept, prediction.slope, prediction.of_readings)
    if prediction.slope_known:
        return line, []
    guess = line.predict_max(budget_bytes)
    if guess is None:
        return None, []
    m, top = limits.batch_multiple, limits.max_batch_size
    batch = min(max(int(CALIBRATE_AT * guess) // m * m, m, (settles or 0) // m * m), top // m * m)
    first = probe(batch)
    if first.fits and first.peak_bytes is not None and first.peak_bytes > line.intercept:
        line = replace(line, slope=(first.peak_bytes - line.intercept) / batch)
    elif not first.fits and first.kind == "oom":
        # The guessed slope was too low. The next guess puts the boundary as far below this batch as this
        # batch was below the first guess's (a line whose boundary is the miss itself has the search creep
        # down from it a sample a probe), or keeps the measured slope it was scaled from where that is
        # steeper: the setting saved less than typical, or nothing (recomputation on the MLP example).
        floor = (budget_bytes - line.intercept) / (CALIBRATE_AT * batch)
        line = replace(line, slope=max(line.slope, floor, prediction.base_slope or 0.0), slope_known=False)
    return line, [first]


def reason(
    maximum: Maximum,
    static: StaticMemory,
    *,
    budget_bytes: int,
    baseline_bytes: int | None,
    batch_multiple: int,
    twin: str | None = None,
    seq_len: int | None = None,
) -> str | None:
    """Why a combination has no exact maximum (None when it has one). ``twin``: the combination without
    recomputation that a pruned one with it could not outplan; ``seq_len``: the tokens per sample its probes
    ran at (when static memory leaves room, what did not fit is one batch at that length)."""
    if maximum.status == "pruned":
        why = (
            f"cannot win: batch {maximum.upper_bound} does not fit, so it plans no micro-batch that {twin} "
            "cannot run, and recomputation only adds work"
            if twin
            else f"cannot win under max-batch: batch {maximum.upper_bound} does not fit, so its maximum is at "
            "most the best so far"
        )
        return f"{why} (not searched exactly; --exact-all searches it)"
    if maximum.status == "incomplete":
        return maximum.notes[-1] if maximum.notes else "the search did not finish"
    if maximum.max_batch_size is not None:
        return None
    process = (
        f" (the probe process itself holds {format_bytes(baseline_bytes)} before building)"
        if baseline_bytes
        else ""
    )
    if (
        not static.total
    ):  # nothing measured it (a script run as it is ran out before its first step's reading)
        return (
            f"batch {batch_multiple} does not fit in the budget of {format_bytes(budget_bytes)}{process}, and no "
            "probe ran far enough to tell the model's own memory (parameters, gradients, optimizer state) from "
            "the batch's"
        )
    static_text = (
        f"parameters {format_bytes(static.parameters)} + gradients {format_bytes(static.gradients)} + optimizer "
        f"state {format_bytes(static.optimizer_state)} = {format_bytes(static.total)} of static memory"
    )
    left = budget_bytes - static.total - (baseline_bytes or 0)
    if left > static.total and left > budget_bytes // 4:  # static memory is not what fails: the batch is
        at = f" at {seq_len:,} tokens per sample" if seq_len is not None else ""
        sample = (
            f"a batch of {batch_multiple} sample(s) of {seq_len:,} tokens"
            if seq_len is not None
            else "the batch"
        )
        return (
            f"batch {batch_multiple} does not fit{at}: {static_text}{process} leave {format_bytes(left)} of the "
            f"budget of {format_bytes(budget_bytes)}, and {sample} needs more"
        )
    return (
        f"batch {batch_multiple} does not fit: {static_text} against a budget of {format_bytes(budget_bytes)}"
        + process
    )


def floor_bytes(baseline_bytes: int | None, static: StaticMemory) -> int:
    """Memory that does not scale with the batch: the probe process's own, the parameters, the optimizer
    state (resident from the second step). Gradients are left out: at the peak of a backward pass only
    some may exist yet. A lower bound of the intercept, as the search needs."""
    return (baseline_bytes or 0) + static.parameters + static.optimizer_state
