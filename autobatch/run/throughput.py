"""The throughput choice's timing: interleaved timing probes until the rates decide (:mod:`autobatch.core.choice`).

The tuner keeps every fitting probe's timed steps (a probe's first step excluded: it allocates the
optimizer state and warms caches) per combination and batch size in :class:`StepTimes`. :func:`settle`
then makes sure each contender has steps at its planned micro-batch, and times again, one round at a
time and one probe per contender in turn, those whose rate is still too uncertain to decide, until none
is or the time cap is spent. Interleaving spreads a neighbour's burst of load over every contender
instead of one; each round runs in the reverse order of the one before (A B, B A, A B, ...), so that
load rising or falling through the rounds favours no contender. Each probe's fastest step is kept too:
load only adds time, so the contenders are compared on those (:attr:`~autobatch.core.choice.Timing.step_time`),
and their spread between probes is the error (:attr:`~autobatch.core.choice.Timing.rse`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from autobatch.core.choice import EQUIVALENT, MAX_ROUNDS, TIMING_SECONDS, Decision, Timing, decide, needs_more
from autobatch.core.units import format_bytes
from autobatch.devices.budget import DeviceInfo
from autobatch.records.protocol import ProbeOutcome
from autobatch.records.result import TuneResult

Key = tuple[str, str, str, bool]  # precision, optimizer, recomputation level, compile


@dataclass(frozen=True)
class Timed:
    """One fitting probe's timed steps, how long its threads waited for a core over its wall time (None: not
    measured), and the OpenMP wait policy it ran under."""

    steps: tuple[float, ...]
    wait: Optional[float]
    policy: Optional[str]
    updates: tuple[float, ...] = ()  # each timed step's update (optimizer step, zero_grad)


@dataclass
class StepTimes:
    """Every fitting probe's :class:`Timed` steps (its first step excluded), per (combination, batch size).

    Only probes run under the latest probe's OpenMP wait policy count: after the probe server restarted with
    threads that sleep while they wait (:mod:`autobatch.probe.yielding`), the steps timed before are not
    comparable, and a contender timed only then is timed again. The search's probes and the timing probes run
    as the job runs (on the CPU device, under the allocator the plan carries: :data:`autobatch.devices.cpu.MALLOC_ENV`),
    so the steps of both count."""

    probes: dict[tuple[Key, int], list[Timed]] = field(default_factory=dict)
    policy: Optional[str] = None  # the latest probe's

    def add(self, key: Key, outcome: ProbeOutcome) -> None:
        """Keep a fitting probe's steps."""
        if not outcome.cached:  # one replayed from the journal ran under another run's policy
            self.policy = outcome.omp_wait_policy
        if outcome.fits and len(outcome.step_seconds) > 1:
            updates = tuple(outcome.update_seconds[1 : len(outcome.step_seconds)])
            timed = Timed(tuple(outcome.step_seconds[1:]), outcome.cpu_wait, outcome.omp_wait_policy, updates)
            self.probes.setdefault((key, outcome.batch_size), []).append(timed)

    def of(self, key: Key, batch: int) -> list[Timed]:
        """The probes of ``key`` at ``batch`` that ran under the current policy."""
        return [t for t in self.probes.get((key, batch), ()) if t.policy == self.policy]

    def get(self, key: Key, batch: int) -> tuple[float, ...]:
        return tuple(s for t in self.of(key, batch) for s in t.steps)

    def timing(
        self, index: int, key: Key, batch: int, world_size: int, accumulation_steps: int = 1
    ) -> Timing:
        """The :class:`~autobatch.core.choice.Timing` of ``key`` at ``batch`` under a plan of
        ``accumulation_steps``: its steps, each probe's fastest, how long each waited for a core, and each
        one's median update."""
        probes = self.of(key, batch)
        fastest = tuple(min(t.steps) for t in probes)
        updates = tuple(statistics.median(t.updates) for t in probes if t.updates)
        if len(updates) != len(probes):
            updates = ()  # not measured by every probe (a script run as it is): the step is the unit
        waits = tuple(t.wait for t in probes)
        return Timing(
            index, batch, world_size, self.get(key, batch), fastest, waits, accumulation_steps, updates
        )


@dataclass(frozen=True)
class Entry:
    """One contender: its place in the user's order, its combination and its planned micro-batch."""

    index: int
    key: Key
    micro_batch_size: int
    accumulation_steps: int = 1


def settle(
    entries: Sequence[Entry],
    times: StepTimes,
    time_once: Callable[[Entry], None],
    world_size: int,
    *,
    cap_seconds: float = TIMING_SECONDS,
    rounds: int = MAX_ROUNDS,
    order: Mapping[int, Any] | None = None,
) -> Decision | None:
    """Time the contenders (none: None) until :func:`~autobatch.core.choice.needs_more` names none (or the cap), then
    :func:`~autobatch.core.choice.decide`. ``time_once(entry)`` runs one timing probe (which adds to
    ``times``); a contender with no steps at its micro-batch is timed once whatever the cap. Ties go to the
    first in ``order`` (:func:`~autobatch.core.choice.preference`)."""
    by_index = {e.index: e for e in entries}

    def timings() -> list[Timing]:
        return [
            times.timing(e.index, e.key, e.micro_batch_size, world_size, e.accumulation_steps)
            for e in entries
        ]

    if len(entries) == 1:  # nothing to compare: no timing
        only = timings()[0]
        return Decision(only.index, None, None, False, only.rse)
    if len(entries) > 1:
        for e in entries:
            if not times.get(e.key, e.micro_batch_size):
                time_once(e)
    started = time.perf_counter()
    for round_ in range(rounds):
        todo = needs_more(timings())
        if not todo or time.perf_counter() - started > cap_seconds:
            break
        for index in todo if round_ % 2 else reversed(todo):  # the first-timed went first: now last
            time_once(by_index[index])
    return decide(timings(), order)


#: Who wins a tie (:func:`autobatch.core.choice.preference`).
TIE_ORDER = "the earlier in your order, and of one precision and optimizer the less recomputation"


def margin_of_choice(result: TuneResult, decision: Decision) -> None:
    """State in the result how the throughput choice was made: the margin, the runner-up, and whether the
    margin is within the noise (then the user's order decided)."""
    chosen = result.chosen
    if chosen is None or decision.runner_up is None:
        return
    chosen.runner_up = result.combinations[decision.runner_up].key
    chosen.margin = None if decision.margin is None else round(decision.margin, 4)
    error = f"{decision.rse:.1%} relative error of the fastest step time"
    if decision.busy:
        chosen.decided_by = (
            f"the machine was busy while timing (every probe of {chosen.runner_up} or of the winner waited for a "
            f"core, their rates are the load's): {TIE_ORDER}; time again on a quiet machine"
        )
    elif decision.tie:
        chosen.decided_by = (
            f"tie within the noise (95 % interval of the timings, Student's t for few probes) or within "
            f"{EQUIVALENT:.0%} with {chosen.runner_up}: {TIE_ORDER} ({error})"
        )
    else:
        chosen.decided_by = f"{(decision.margin or 0):+.1%} samples/s over {chosen.runner_up} ({error})"


def edge_note(key: str, maximum: int | None, outcome: ProbeOutcome, device: DeviceInfo | None) -> str | None:
    """What a timing probe at the maximum says of it, when it came within the margin or ran out of memory
    in its fresh process (None otherwise). Timing probes ask for step times, not a verdict (the tuner runs
    them without the margin rule, and their steps count); the maximum stands on the search's evidence,
    and the result says what this probe saw."""
    if device is None or outcome.batch_size != maximum:
        return None
    if outcome.fits and not device.too_close(outcome.peak_bytes):
        return None
    seen = (
        f"fitted within the {format_bytes(device.margin_bytes)} margin (peak {format_bytes(outcome.peak_bytes)})"
        if outcome.fits
        else f"did not fit ({outcome.reason or outcome.kind})"
    )
    return (
        f"{key}: a timing probe at the maximum {maximum} {seen} in a fresh process, where the search's "
        f"confirmation fitted: this maximum sits on the edge; `autobatch check -b {maximum}` measures it "
        "again, a batch one smaller leaves room"
    )
