"""A tune: every combination's exact maximum, throughput at the plan, the choice, and the result.

The pure core decides (``core.maximum`` each combination, ``core.reuse`` the priors, ``core.plan`` the plan and the
choice); this module only wires it to a
:class:`Session` that runs probes, and keeps the result up to date after every probe, so that an
interrupted or failed run still leaves the probes it measured (``status`` says how it ended).
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import NamedTuple, Optional

from autobatch.core import reuse
from autobatch.core.choice import reach_beyond
from autobatch.core.levels import OFF, PARTIAL, fraction
from autobatch.core.maximum import StaticMemory, find_maximum, floor_bytes, reason
from autobatch.core.model import Affine
from autobatch.core.plan import knee
from autobatch.core.rank_prior import per_rank
from autobatch.core.search import Observation
from autobatch.core.space import Combo, Ident, combinations, script_combos, script_note
from autobatch.errors import (
    CompileFailed,
    ContractError,
    ScriptError,
)
from autobatch.probe.files import written_note
from autobatch.records.failures import with_larger_oom
from autobatch.records.protocol import ProbeOutcome
from autobatch.records.readings import measured_static, observation
from autobatch.records.result import (
    NO_BLOCKS,
    ComboResult,
    ProbeRecord,
    TuneResult,
    nothing_chosen,
)
from autobatch.records.version import __version__
from autobatch.run import levels
from autobatch.run.choosing import Chooser
from autobatch.run.lengths import LengthSearch
from autobatch.run.options import TuneOptions
from autobatch.run.rank_priors import StrategyPriors
from autobatch.run.session import Session
from autobatch.run.throughput import StepTimes
from autobatch.run.watch import Watch
from autobatch.step.as_is import batch_way


class Twin(NamedTuple):
    """Under throughput, a combination with recomputation's searched twin without it, and the smallest maximum
    with which it plans a micro-batch the twin cannot run (None: none does)."""

    result: ComboResult
    reach: Optional[int]


class Tuner:
    """Runs one tune over a started :class:`Session`; :attr:`result` is always current."""

    def __init__(
        self,
        session: Session,
        options: TuneOptions,
        on_update: Callable[[TuneResult], None] | None = None,
        on_status: Callable[[str], None] | None = None,
    ) -> None:
        assert session.device is not None
        self.session = session
        self.options = options
        self.on_update = on_update
        self.on_status = on_status
        self.cross = StrategyPriors.of(session)  # a strategy's priors from the single-process probes
        self.started = time.perf_counter()
        self.learned: list[reuse.Learned] = []
        self.lines: dict[Ident, Affine] = {}  # each combination's line at the plan's length
        self.level_priors: dict[Ident, reuse.Prediction | None] = {}  # partial levels: from off and full
        self.targets: dict[Ident, int | None] = {}  # a resolved K/N: the micro-batch it was chosen for
        self.script_accumulation = 1  # a script run as it is: micro-batches per optimizer step of its own
        device = session.device
        self.step_times = StepTimes()
        way = (
            batch_way(session.settings.script.script_args, session.spec.options.get("batch_env"))
            if session.as_is
            else None
        )
        self.watch = Watch(
            device.budget_bytes, strict=options.strict, warn=session.warn, batch_way=way
        )  # leaks, data
        self.result = TuneResult(
            script=str(session.script),
            script_args=list(session.settings.script.script_args),
            device=device.to_dict(),
            objective=options.objective,
            combinations=[],
            status="running",
            torch_version=session.torch_version,
            autobatch_version=__version__,
            created=datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
            notes=list(device.notes),
            pid=os.getpid(),
            host=socket.gethostname(),
        )
        session.warnings.keep_in(self.result.notes)  # the run's warnings, those before it too, are notes
        if session.settings.distributed.strategy != "none":
            self.result.distributed = {
                "strategy": session.settings.distributed.strategy,
                "nproc_per_node": session.ranks,
                "blocks": list(session.blocks),
            }
        if session.as_is:  # the plan's command line is filled in from it (autobatch.emit.args)
            self.result.as_is = {k: session.spec.options.get(k) for k in ("batch_env", "variants")}
            self.result.as_is["python"] = sys.executable  # the job's command runs the Python that measured
            if session.spec.options.get("seq_len_env"):  # the plan's length reaches the job by it too
                self.result.as_is["seq_len_env"] = session.spec.options["seq_len_env"]
        self.lengths: LengthSearch | None = None
        if options.plan_seq_len is not None:
            line = device.budget_bytes - device.margin_bytes
            multiple = options.limits.batch_multiple
            self.lengths = LengthSearch(self.result, options.seq_lens, options.plan_seq_len, line, multiple)
        if options.world_note:
            self.result.notes.append(options.world_note)

    def run(self) -> TuneResult:
        device = self.session.device
        assert device is not None
        opts = self.options
        combos = combinations(opts.precisions, opts.optimizers, opts.recompute, opts.compile)
        if self.session.as_is:  # its precision, optimizer and recomputation are the script's own
            combos = script_combos(variants := self.session.spec.options.get("variants") or {})
            self.result.notes.append(script_note(variants))
        combos = [combo.at(self.options.plan_seq_len) for combo in combos]
        for combo in combos:
            entry = ComboResult.of(combo)
            if combo.recompute:
                entry.recompute_blocks = dict(device.recompute_counts)  # what its probes wrap
            self.result.combinations.append(entry)
        for index, entry in enumerate(self.result.combinations):
            combo = combos[index] = self._resolved(combos[index], entry)  # a partial level: its K, now
            twin = self._twin_reach(combo)  # under throughput, recomputation must outplan its twin
            skip = entry.reason if entry.status == "skipped" else self._skip_reason(combo, twin)
            if skip:
                entry.status, entry.reason = "skipped", skip
                continue
            self._search(combo, entry, twin)
            neighbour = self._neighbour(combo, entry)
            if neighbour is not None:  # searched in its turn, after this one
                combos.append(neighbour[0])
                self.result.combinations.append(neighbour[1])
            self._update()
        chooser = Chooser(
            self.result, self.options, self.session, self.step_times, self._record, self.script_accumulation
        )
        chooser.plan_and_choose(combos)
        if self.lengths is not None:  # the plan is made: now the other lengths
            self.lengths.run(combos, self._search)
            for warning in self.lengths.unmoved(combos):
                self.session.warn(warning)
        if note := written_note(self.session.files.written):
            self.result.notes.append(note)
        self.result.status = "complete"
        self._update()
        if self.result.chosen is None:
            raise nothing_chosen(self.result, device.budget_bytes, self.session.settings.door)
        return self.result

    # -- per combination ------------------------------------------------------------------------

    def _resolved(self, combo: Combo, entry: ComboResult, at_least: int = 1) -> Combo:
        """``combo``, its ``partial`` level resolved to the K the plan needs, ``at_least`` (autobatch.run.levels)."""
        device = self.session.device
        assert device is not None
        if combo.recompute_level != PARTIAL or not device.recompute_blocks:
            return combo
        maxima = {c.ident: c.max_batch_size for c in self.result.combinations if c.answered}
        blocks = sum(device.recompute_counts.values())
        line = device.budget_bytes - device.margin_bytes
        partial = levels.resolve(combo, self.lines, maxima, blocks, self.options, line, at_least)
        if partial.combo is None:
            entry.status, entry.reason = "skipped", partial.skip
            return combo
        entry.recompute_level = partial.combo.recompute_level
        self.level_priors[partial.combo.ident] = partial.prior
        self.targets[partial.combo.ident] = partial.target
        return partial.combo

    def _neighbour(self, combo: Combo, entry: ComboResult) -> tuple[Combo, ComboResult] | None:
        """The next K, when the partial level the lines predicted fell short of the micro-batch it was for: the
        prediction's neighbour, one block more, in a row of its own (None: it held, or there is no next K)."""
        target = self.targets.get(combo.ident)
        if target is None:
            return None
        if entry.status not in ("pruned", "infeasible") and (entry.max_batch_size or 0) >= target:
            return None
        partial = combo.with_level(PARTIAL)
        k, _ = fraction(combo.recompute_level) or (0, 0)
        neighbour = ComboResult.of(partial, recompute_blocks=dict(entry.recompute_blocks))
        found_combo = self._resolved(partial, neighbour, at_least=k + 1)
        if found_combo.recompute_level == PARTIAL:  # no K left between it and full
            return None
        return found_combo, neighbour

    def _skip_reason(self, combo: Combo, twin: Twin | None) -> str | None:
        device = self.session.device
        assert device is not None
        unsupported = device.unsupported(combo.precision)
        if unsupported:
            return unsupported
        if combo.recompute and not device.recompute_blocks:
            return f"{NO_BLOCKS} (name them with --recompute-class or RECOMPUTE_CLASSES)"
        if twin is not None and twin.reach is None:
            return (
                f"cannot win: {twin.result.key} already plans the largest micro-batch this one could, and "
                "recomputation only adds work (not searched; --exact-all searches it)"
            )
        return None

    def _search(self, combo: Combo, entry: ComboResult, twin: Twin | None = None) -> None:
        """One combination's exact maximum; a model that does not compile is that combination's answer (the
        others go on)."""
        try:
            self._find(combo, entry, twin)
        except CompileFailed as exc:
            entry.status, entry.reason = "uncompiled", exc.message
            self.result.notes.append(f"{combo.key}: {exc.message}")

    def _find(self, combo: Combo, entry: ComboResult, twin: Twin | None = None) -> None:
        device = self.session.device
        assert device is not None
        limits = self.options.limits
        outcomes: dict[int, ProbeOutcome] = {}

        def probe(batch: int, steps: tuple[int, int], purpose: str) -> Observation:
            try:
                outcome = self.session.probe(combo, batch, min_steps=steps[0], max_steps=steps[1])
            except CompileFailed:
                raise
            except (ScriptError, ContractError) as exc:  # half the answer when a larger batch did not fit
                raise with_larger_oom(exc, batch, outcomes.values(), limits.batch_multiple) from None
            if purpose != "confirm" or outcome.fits:
                outcomes[batch] = outcome
            entry.compile_seconds = outcome.compile_seconds or entry.compile_seconds
            self._record(entry, outcome, purpose)
            return observation(outcome, state_bytes=analytic.optimizer_state)

        shapes = [tuple(s) for s in device.param_shapes]
        analytic = StaticMemory.analytic(combo.precision, combo.optimizer, shapes, device.param_count)
        analytic = per_rank(
            analytic, self.session.settings.distributed.strategy, self.session.ranks
        )  # FSDP shards it
        known = [
            observation(o, state_bytes=analytic.optimizer_state)
            for o in self._journaled(combo, entry, outcomes)
        ]
        answer = find_maximum(
            probe,
            known=known,
            # The model aims at the line a fit must stay under (the budget less the CPU margin).
            budget_bytes=device.budget_bytes - device.margin_bytes,
            limits=limits,
            prediction=self._prior(combo),
            floor_bytes=floor_bytes(device.baseline_bytes, analytic),
            prune_at_or_below=twin.reach if twin is not None else self._prune_threshold(combo),
        )
        static = measured_static(outcomes.values()) or analytic
        entry.static_bytes = static.to_dict()
        entry.status, entry.max_batch_size = answer.status, answer.max_batch_size
        entry.reason = reason(
            answer,
            static,
            budget_bytes=device.budget_bytes,
            baseline_bytes=device.baseline_bytes,
            batch_multiple=limits.batch_multiple,
            twin=twin.result.key if twin is not None else None,
            seq_len=combo.seq_len,
        )
        self.result.notes.extend(f"{combo.key}: {note}" for note in answer.notes)
        self.watch.answer(combo.key, entry, self.result.notes)
        best = outcomes.get(answer.max_batch_size) if answer.max_batch_size is not None else None
        if best is not None and answer.status != "pruned":
            entry.peak_bytes, entry.samples_per_second = best.peak_bytes, best.samples_per_second
        self._learn(combo, entry, answer.model)
        points = [
            (b, o.samples_per_second) for b, o in sorted(outcomes.items()) if o.fits and o.samples_per_second
        ]
        entry.knee_batch_size = knee(points) if points else None

    def _learn(self, combo: Combo, entry: ComboResult, model: Affine | None) -> None:
        """Keep a search's line: the entry's slope, the surface's line, and at the plan's length the grid's."""
        if model is None:
            return
        entry.bytes_per_sample = model.slope
        # A search that fit no batch measured no line: its model is the prior it started from (at a further
        # length, the surface scaled up), which fitted as measured would make the surface of its own guess.
        if self.lengths is not None and entry.max_batch_size:
            self.lengths.learn(combo, model, entry.max_batch_size if entry.status == "exact" else None)
        if combo.seq_len == self.options.plan_seq_len:  # other lengths are the surface's, not the grid's
            self.lines[combo.ident] = model
            self.learned.append(reuse.Learned.of(combo, model))

    def _journaled(
        self, combo: Combo, entry: ComboResult, outcomes: dict[int, ProbeOutcome]
    ) -> list[ProbeOutcome]:
        """What an earlier run of this tune measured for ``combo`` (interrupted, say): in the trace as cached,
        and where the search starts from."""
        limits = self.options.limits
        journaled = self.session.journaled(combo, (limits.search_steps, limits.confirm))
        for outcome in journaled:
            outcomes[outcome.batch_size] = outcome
            self._record(entry, outcome)
        return journaled

    def _twin_reach(self, combo: Combo) -> Twin | None:
        """The :class:`Twin` of a combination with recomputation under throughput (None: no such bar)."""
        opts, limits = self.options, self.options.limits
        if not combo.recompute or opts.objective != "throughput" or opts.exact_all:
            return None
        twin = {c.ident: c for c in self.result.combinations}.get(combo.with_level(OFF).ident)
        if twin is None or not twin.answered or not twin.max_batch_size:
            return None
        plan = (opts.global_batch_size, opts.world_size, limits.batch_multiple, limits.max_batch_size)
        return Twin(twin, reach_beyond(twin.max_batch_size, *plan))

    def _prune_threshold(self, combo: Combo) -> int | None:
        """Under max-batch, a later combination must beat the best maximum so far (ties go to the earlier);
        at another length than the plan's, every maximum is searched."""
        if (
            self.options.objective != "max-batch"
            or self.options.exact_all
            or combo.seq_len != self.options.plan_seq_len
        ):
            return None
        best = max(
            (c.max_batch_size for c in self.result.combinations if c.answered and c.max_batch_size),
            default=None,
        )
        return best + self.options.limits.batch_multiple if best else None

    def _record(self, entry: ComboResult, outcome: ProbeOutcome, purpose: str = "search") -> None:
        """Keep one probe: its step times, its trace row, the result file rewritten, then the leak watch."""
        self.step_times.add(entry.ident, outcome)
        own = outcome.info.get("micro_batches_per_step")  # a script run as it is that accumulates of its own
        if outcome.fits and own:
            self.script_accumulation = int(own)
        entry.trace.append(ProbeRecord.of(outcome, purpose))
        entry.probes = len(entry.trace)
        self._update()
        self.watch.probe(entry.key, outcome)  # after the update: a leak's probe is in the partial result

    def _prior(self, combo: Combo) -> reuse.Prediction | None:
        device = self.session.device
        assert device is not None
        length = self.lengths.prior(combo) if self.lengths is not None else None
        if length is not None or combo.ident in self.level_priors:
            return length or self.level_priors[combo.ident]
        shapes = [tuple(s) for s in device.param_shapes]
        grid = reuse.predict(combo, self.learned, shapes)
        if self.cross is None or (grid is not None and grid.slope_known):
            return grid  # a line measured under this strategy beats one moved from a single process
        prior = self.cross.predict(combo)
        if prior is None:
            return grid
        note = self.cross.describe(combo, prior, device.budget_bytes - device.margin_bytes)
        self.result.notes.append(note)
        if self.on_status is not None:
            self.on_status(note)
        return prior

    def _update(self) -> None:
        rows = [*self.result.combinations, *(self.result.lengths.maxima if self.result.lengths else [])]
        self.result.probes = sum(
            1 for c in {id(r): r for r in rows}.values() for p in c.trace if not p.cached
        )
        self.result.wall_seconds = round(time.perf_counter() - self.started, 3)
        self.result.script_files = self.session.files.to_result()
        if self.on_update:
            self.on_update(self.result)
