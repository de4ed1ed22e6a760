"""The end of a tune at the plan's length: each combination's accumulation plan, and the choice.

Under ``max-batch`` the largest maximum wins (:func:`autobatch.core.plan.choose`); under ``throughput`` the
contenders that recomputation cannot win are dropped (:func:`autobatch.core.choice.dominated`) and the rest
are timed at their planned micro-batch, interleaved, until the rates decide (:mod:`autobatch.run.throughput`).
The tuner hands a :class:`Chooser` what it reads whole (the result, the options, the session, the step
times) and the function that records a probe, and calls :meth:`Chooser.plan_and_choose` once every maximum is known.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autobatch.core.choice import Contender, Decision, dominated, preference
from autobatch.core.plan import Candidate, Plan, choose, plan_accumulation, plan_with_script_accumulation
from autobatch.core.space import Combo
from autobatch.core.world import strategy_fields
from autobatch.devices.backend import backend_for
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
        assert self.session.device is not None
        # what the probes ran under, which the answer holds under: the plan's command and the env format set it
        self.result.chosen.environment = dict(backend_for(self.session.device.type).job_environment)
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
        )
        self.record(entry, outcome, "throughput")
        if outcome.fits:
            entry.samples_per_second = outcome.samples_per_second
        note = edge_note(combo.key, entry.max_batch_size, outcome, self.session.device)
        if note:
            self.result.notes.append(note)
        return outcome.samples_per_second
