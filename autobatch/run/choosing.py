"""The end of a tune at the plan's length: each combination's accumulation plan, and the choice.

Under ``max-batch`` the largest maximum wins (:func:`autobatch.core.plan.choose`); under ``throughput`` the
contenders that recomputation cannot win are dropped (:func:`autobatch.core.choice.dominated`) and the rest
are timed at their planned micro-batch, interleaved, until the rates decide (:mod:`autobatch.run.throughput`).
The tuner hands a :class:`Chooser` what it reads whole (the result, the options, the session, the step
times) and the function that records a probe, and calls :meth:`Chooser.plan_and_choose` once every maximum is known.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from autobatch.core.choice import Contender, Decision, dominated, preference
from autobatch.core.plan import Candidate, Plan, choose, plan_accumulation, plan_with_script_accumulation
from autobatch.core.space import Combo
from autobatch.core.units import format_bytes
from autobatch.core.world import strategy_fields
from autobatch.devices.cpu import MALLOC_ENV, TIMING_ROOM
from autobatch.records.protocol import ProbeOutcome
from autobatch.records.result import Chosen, ComboResult, TuneResult
from autobatch.run.options import TuneOptions
from autobatch.run.session import Session
from autobatch.run.throughput import Entry, StepTimes, edge_note, margin_of_choice, settle
from autobatch.step.as_is import ACCUM_PLACEHOLDER

#: Keeps one probe in its combination's trace, as the tuner keeps every probe (the step times, the result
#: file rewritten, the leak watch): the combination's row, the outcome and the probe's purpose.
Record = Callable[[ComboResult, ProbeOutcome, str], None]


@dataclass
class Chooser:
    """Plans every combination that found a maximum and chooses one, timing the contenders under throughput;
    every timing probe is kept through ``record``."""

    result: TuneResult
    options: TuneOptions
    session: Session
    step_times: StepTimes
    record: Record
    script_accumulation: int = (
        1  # a script run as it is: micro-batches per optimizer step of its own (else 1)
    )
    #: Combination key -> the timing probe under the job's allocator that fitted the room it has above the
    #: budget but peaked above the budget (:meth:`_over_budget`): that plan holds under the pinned allocator only.
    over_budget: dict[str, ProbeOutcome] = field(default_factory=dict)

    def plan_and_choose(self, combos: list[Combo]) -> None:
        """Each answered combination's plan into its row, and the chosen one into :attr:`TuneResult.chosen`."""
        opts = self.options
        candidates: list[Candidate] = []
        plans: dict[int, Plan] = {}
        for index, entry in enumerate(self.result.combinations):
            if not entry.answered or entry.max_batch_size is None:
                candidates.append(Candidate(index, None, None, None))
                continue
            plan = self._plan(entry.max_batch_size)
            plans[index] = plan
            entry.plan = [plan.micro_batch_size, plan.accumulation_steps]
            candidates.append(Candidate(index, entry.max_batch_size, entry.samples_per_second, plan))
        decision = self._settle(combos, plans) if opts.objective == "throughput" else None
        winner = decision.winner if decision is not None else choose(candidates, opts.objective)
        if winner is None:
            return
        entry = self.result.combinations[winner]
        plan = plans[winner]
        self.result.chosen = Chosen.of(
            entry,
            plan,
            **strategy_fields(
                self.session.settings.distributed.strategy, self.session.ranks, plan.world_size
            ),
        )
        if self.script_accumulation > 1:
            self.result.chosen.script_accumulation = self.script_accumulation
        over = None if self.step_times.pinned else self.over_budget.get(entry.key)
        if (
            self.step_times.pinned or over is not None
        ):  # it holds under the probes' allocator only: the job runs it
            self.result.chosen.environment = dict(MALLOC_ENV)
        if over is not None:
            self._over_budget(entry.key, over)
        if opts.objective == "throughput" and decision is None and len(plans) > 1:
            self.result.notes.append(
                f"chosen without a time: no contender's timing probe ran its steps, so the largest maximum "
                f"({entry.key}) was chosen"
            )
        if decision is not None:
            margin_of_choice(self.result, decision)

    def _plan(self, max_batch_size: int) -> Plan:
        """A combination's accumulation plan; a script run as it is that accumulates of its own is given the
        accumulation that, times its own, reaches the global batch (:func:`plan_with_script_accumulation`)."""
        opts = self.options
        if self.script_accumulation > 1:
            settable = any(ACCUM_PLACEHOLDER in arg for arg in self.session.settings.script.script_args)
            return plan_with_script_accumulation(
                max_batch_size,
                opts.global_batch_size,
                opts.world_size,
                opts.limits.batch_multiple,
                self.script_accumulation,
                settable,
            )
        return plan_accumulation(
            max_batch_size, opts.global_batch_size, opts.world_size, opts.limits.batch_multiple
        )

    def _settle(self, combos: list[Combo], plans: dict[int, Plan]) -> Decision | None:
        """The throughput choice (:mod:`autobatch.core.choice`): drop what recomputation cannot win,
        then time the rest, interleaved, until the rates decide."""
        contenders = [
            Contender(
                i,
                c.precision,
                c.optimizer,
                c.recompute_level,
                self.result.combinations[i].max_batch_size or 0,
                plans[i].micro_batch_size,
                plans[i].accumulation_steps,
                c.compile,
            )
            for i, c in enumerate(combos)
            if i in plans
        ]
        dropped = dominated(contenders)
        for index, twin in dropped.items():
            self.result.notes.append(
                f"{combos[index].key}: not chosen: {combos[twin].key} fits the same micro-batch with less "
                "recomputation, which only adds work"
            )
        entries = [
            Entry(c.index, combos[c.index].ident, c.micro_batch_size, c.accumulation_steps)
            for c in contenders
            if c.index not in dropped
        ]

        def time_once(e: Entry) -> None:
            self._throughput_at(
                combos[e.index], self.result.combinations[e.index], e.micro_batch_size, again=True
            )

        world = self.options.world_size
        order = preference(contenders)
        decision = settle(entries, self.step_times, time_once, world, order=order)
        for e in entries:
            timing = self.step_times.timing(e.index, e.key, e.micro_batch_size, 1, e.accumulation_steps)
            if timing.rate > 0:  # per rank, as every probe's rate: the world's is world times it
                entry = self.result.combinations[e.index]
                entry.samples_per_second = round(timing.rate, 3)
                entry.global_batch_seconds = round(timing.global_time, 4)
        return decision

    def _pin_allocator(self, combo: Combo, outcome: ProbeOutcome) -> None:
        """A timing probe under glibc's default allocator (the job's) ran out of memory with room for its heap:
        the maximum holds under the probes' pinned allocator only. From now on the job runs it (the plan's
        command and ``env`` carry it: :attr:`~autobatch.records.result.Chosen.environment`), and every contender
        is timed under it (the steps timed under the job's allocator stop counting)."""
        self.step_times.pinned = True
        peak = f" (peak {format_bytes(outcome.peak_bytes)})" if outcome.peak_bytes else ""
        self.result.notes.append(
            _glibc_note(
                combo.key,
                outcome,
                f"ran out of memory{peak} with {format_bytes(TIMING_ROOM)} of room above the budget: the maxima hold",
                "so the plan's command and the env format set it, and the contenders were timed under it",
            )
        )

    def _over_budget(self, key: str, outcome: ProbeOutcome) -> None:
        """The note on a chosen plan whose timing probe under glibc's defaults fitted its room but peaked above the
        budget (a red-team's plan of 4096: 851.75 MiB under a capacity of 700 MiB, 591 MiB pinned): the plan holds
        under the probes' pinned allocator only, which the plan's command and ``env`` carry. Only the chosen plan's
        counts: another contender's (the quick start's recomputing one, 592 MiB at 64 under a 450 MiB budget)
        says nothing of a plan that runs under glibc's defaults within the budget."""
        assert self.session.device is not None
        budget = format_bytes(self.session.device.budget_bytes)
        self.result.notes.append(
            _glibc_note(
                key,
                outcome,
                f"peaked {format_bytes(outcome.peak_bytes)}, above the budget of {budget}: the plan holds",
                "which the plan's command and the env format set (its time was taken under glibc's defaults)",
            )
        )

    def _throughput_at(
        self, combo: Combo, entry: ComboResult, micro: int, again: bool = False
    ) -> float | None:
        """Samples per second at the planned micro-batch (measured now if no probe ran there, or ``again``)."""
        for record in reversed(entry.trace if not again else []):
            if record.batch_size == micro and record.kind == "fits" and record.samples_per_second:
                if micro != entry.max_batch_size:
                    entry.samples_per_second = record.samples_per_second
                return record.samples_per_second
        limits = self.options.limits
        # A timing probe asks for step times, not a verdict: its steps count even when its peak comes
        # within the margin (it ran them all); what it says of the maximum becomes a note.
        outcome = self.session.probe(
            combo,
            micro,
            min_steps=limits.max_steps,
            max_steps=limits.max_steps,
            strict=False,
            fresh=again,
            timing=True,
            pinned_allocator=self.step_times.pinned,
        )
        self.record(entry, outcome, "throughput")
        if outcome.kind == "oom" and outcome.job_allocator:  # the job's allocator needs more than the budget
            self._pin_allocator(combo, outcome)
            return self._throughput_at(combo, entry, micro, again=True)
        assert self.session.device is not None
        if (
            outcome.fits
            and outcome.job_allocator
            and (outcome.peak_bytes or 0) > self.session.device.budget_bytes
        ):
            self.over_budget[entry.key] = (
                outcome  # within the room above the budget: the chosen plan's counts
            )
        if outcome.fits:
            entry.samples_per_second = outcome.samples_per_second
        note = edge_note(combo.key, entry.max_batch_size, outcome, self.session.device)
        if note:
            self.result.notes.append(note)
        return outcome.samples_per_second


def _glibc_note(key: str, outcome: ProbeOutcome, found: str, so: str) -> str:
    """A note on a timing probe under glibc's default allocator that needed more than the budget: what it
    ``found``, the allocator the probes ran, and ``so``, what the plan does about it."""
    settings = " ".join(f"{k}={v}" for k, v in MALLOC_ENV.items())
    return (
        f"{key}: at micro-batch {outcome.batch_size} a timing probe under glibc's default allocator, as a job "
        f"runs it, {found} under the allocator the probes ran ({settings}), {so}"
    )
