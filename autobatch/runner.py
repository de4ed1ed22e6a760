"""A tune: every combination's exact maximum, throughput at the plan, the choice, and the result.

The pure core decides (``core.search``, ``core.plan``, ``core.reuse``); this module only wires it to a
:class:`Session` that runs probes, and keeps the result up to date after every probe, so that an
interrupted or failed run still leaves the probes it measured (``status`` says how it ended).
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import __version__
from .core import reuse
from .core.plan import Candidate, Plan, choose, knee, plan_accumulation
from .core.search import Affine, Observation, SearchResult, search_max_batch
from .core.space import Combo, combinations, optimizer_state_bytes
from .core.units import format_bytes
from .errors import NothingFitsError
from .probe.protocol import ProbeOutcome
from .result import Chosen, ComboResult, ProbeRecord, TuneResult
from .session import Session

#: Where the calibration probe goes, as a fraction of the boundary a guessed slope predicts (measured
#: here: guesses for another precision or recomputation setting were 4-70 % too high).
CALIBRATE_AT = 0.8
#: How many times a maximum that fails its longer confirmation probe is searched again below.
MAX_CONFIRM_ROUNDS = 4

#: Without a prior, the first probe is the 8th candidate, not the 1st: at the smallest batch the fixed
#: memory and its noise hide the per-sample cost (measured here: peaks at batch 1 and 2 differ by -9 MiB).
SCOUT_CANDIDATES = 8


@dataclass(frozen=True)
class TuneOptions:
    precisions: tuple[str, ...]
    optimizers: tuple[str, ...]
    recompute: tuple[bool, ...]
    batch_multiple: int = 1
    max_batch_size: int = 65536
    steps: int = 3
    max_steps: int = 8
    confirm_steps: int = 10
    global_batch_size: int | None = None
    world_size: int = 1
    world_size_source: str = "default"
    objective: str = "throughput"
    exact_all: bool = False


@dataclass
class _Known:
    """What a finished combination taught us, for predicting the next ones."""

    combo: Combo
    model: Affine | None
    static_bytes: int
    outcomes: list[ProbeOutcome] = field(default_factory=list)


class Tuner:
    """Runs one tune over a started :class:`Session`; :attr:`result` is always current."""

    def __init__(
        self, session: Session, options: TuneOptions, on_update: Callable[[TuneResult], None] | None = None
    ) -> None:
        assert session.device is not None
        self.session = session
        self.options = options
        self.on_update = on_update
        self.started = time.perf_counter()
        self.known: list[_Known] = []
        device = session.device
        self.result = TuneResult(
            script=str(session.script),
            script_args=list(session.script_args),
            device=device.to_dict(),
            objective=options.objective,
            combinations=[],
            status="running",
            torch_version=session.client.torch_version if session.client else None,
            autobatch_version=__version__,
            created=datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
            notes=list(device.notes),
        )
        if options.world_size_source != "default":
            self.result.notes.append(f"world size {options.world_size} from {options.world_size_source}")

    def run(self) -> TuneResult:
        device = self.session.device
        assert device is not None
        combos = combinations(self.options.precisions, self.options.optimizers, self.options.recompute)
        for combo in combos:
            entry = ComboResult(combo.precision, combo.optimizer, combo.recompute)
            self.result.combinations.append(entry)
        for combo, entry in zip(combos, self.result.combinations):
            skip = self._skip_reason(combo)
            if skip:
                entry.status, entry.reason = "skipped", skip
                continue
            self._search(combo, entry)
            self._update()
        self._plan_and_choose(combos)
        self.result.status = "complete"
        self._update()
        if self.result.chosen is None:
            raise NothingFitsError(
                "no combination fits even the smallest batch within the budget of "
                f"{format_bytes(device.budget_bytes)}",
                hint="see each combination's reason (static memory vs budget); try bf16, a lighter optimizer, "
                "recomputation, or more --memory",
            )
        return self.result

    # -- per combination ------------------------------------------------------------------------

    def _skip_reason(self, combo: Combo) -> str | None:
        device = self.session.device
        assert device is not None
        if combo.precision in device.unsupported_precisions:
            return f"{device.name} cannot run {combo.precision}: {device.unsupported_precisions[combo.precision]}"
        if combo.recompute and not device.recompute_blocks:
            return "no repeated blocks to recompute (name them with --recompute-class or RECOMPUTE_CLASSES)"
        return None

    def _search(self, combo: Combo, entry: ComboResult) -> None:
        device = self.session.device
        assert device is not None
        opts = self.options
        outcomes: dict[int, ProbeOutcome] = {}
        misses: set[int] = set()  # batch sizes that did not fit, confirmations included

        def probe(batch: int) -> Observation:
            # Next to a known non-fit, a fit is the answer: run it as long as the confirmation, so
            # that it needs none (an out-of-memory step comes early, so a miss costs little more).
            if batch + opts.batch_multiple in misses:
                outcome = self.session.probe(
                    combo, batch, min_steps=opts.confirm_steps, max_steps=opts.confirm_steps
                )
            else:
                outcome = self.session.probe(combo, batch, min_steps=opts.steps, max_steps=opts.max_steps)
            if not outcome.fits:
                misses.add(batch)
            outcomes[batch] = outcome
            self._record(entry, outcome)
            return _observation(outcome)

        prior, known = self._calibrate(self._prior(combo), probe)
        prune = self._prune_threshold()
        # Memory that does not scale with the batch: the probe process's own, the parameters, the
        # optimizer state (resident from the second step). Gradients are left out: at the peak of a
        # backward pass only some may exist yet. A lower bound of the intercept, as the search needs.
        analytic = self._static(combo, {})
        floor = (device.baseline_bytes or 0) + analytic["parameters"] + analytic["optimizer_state"]
        result: SearchResult | None = None
        for _round in range(MAX_CONFIRM_ROUNDS + 1):
            result = search_max_batch(
                probe,
                budget_bytes=device.budget_bytes,
                max_batch_size=opts.max_batch_size,
                batch_multiple=opts.batch_multiple,
                prior=prior,
                known=known,
                prune_at_or_below=prune,
                start=SCOUT_CANDIDATES * opts.batch_multiple,
                floor_bytes=floor,
            )
            known = [*known, *result.trace]
            if result.max_batch_size is None or result.status == "pruned":
                break
            searched = outcomes.get(result.max_batch_size)
            if searched is not None and searched.fits and searched.steps >= opts.confirm_steps:
                break  # the search's own probe of it ran as long as a confirmation
            # The number a user gets must hold in their job: confirm it with a longer probe.
            confirm = self.session.probe(
                combo, result.max_batch_size, min_steps=opts.confirm_steps, max_steps=opts.confirm_steps
            )
            self._record(entry, confirm, "confirm")
            if confirm.fits:
                outcomes[result.max_batch_size] = confirm
                break
            self.result.notes.append(
                f"{combo.key}: batch {result.max_batch_size} fitted {opts.steps}+ steps but not {opts.confirm_steps}; searched below it"
            )
            misses.add(result.max_batch_size)
            known.append(Observation(result.max_batch_size, fits=False, kind=confirm.kind))
        assert result is not None
        static = self._static(combo, outcomes)
        entry.static_bytes = static
        entry.status = result.status
        entry.max_batch_size = result.max_batch_size
        if result.status == "pruned":
            entry.reason = (
                f"cannot win under max-batch: batch {result.upper_bound} does not fit, so its maximum is at most "
                "the best so far (not searched exactly; --exact-all searches it)"
            )
        elif result.max_batch_size is None:
            total = sum(static.values())
            entry.reason = (
                f"batch {opts.batch_multiple} does not fit: parameters {format_bytes(static['parameters'])} + gradients "
                f"{format_bytes(static['gradients'])} + optimizer state {format_bytes(static['optimizer_state'])} = "
                f"{format_bytes(total)} of static memory against a budget of {format_bytes(device.budget_bytes)}"
                + (
                    f" (the probe process itself holds {format_bytes(device.baseline_bytes)} before building)"
                    if device.baseline_bytes
                    else ""
                )
            )
        else:
            best = outcomes.get(result.max_batch_size)
            if best is not None:
                entry.peak_bytes = best.peak_bytes
                entry.samples_per_second = best.samples_per_second
        if result.model is not None:
            entry.bytes_per_sample = result.model.slope
        points = [
            (b, o.samples_per_second) for b, o in sorted(outcomes.items()) if o.fits and o.samples_per_second
        ]
        entry.knee_batch_size = knee(points) if points else None
        self.known.append(_Known(combo, result.model, sum(static.values()), list(outcomes.values())))

    def _prune_threshold(self) -> int | None:
        """Under max-batch, a later combination must beat the best maximum so far (ties go to the earlier)."""
        if self.options.objective != "max-batch" or self.options.exact_all:
            return None
        best = max(
            (
                c.max_batch_size
                for c in self.result.combinations
                if c.status in ("exact", "capped") and c.max_batch_size
            ),
            default=None,
        )
        return best + self.options.batch_multiple if best else None

    def _record(self, entry: ComboResult, outcome: ProbeOutcome, purpose: str = "search") -> None:
        entry.trace.append(
            ProbeRecord(
                batch_size=outcome.batch_size,
                kind=outcome.kind,
                peak_bytes=outcome.peak_bytes,
                steps=outcome.steps,
                seconds=round(outcome.wall_seconds, 3),
                samples_per_second=outcome.samples_per_second,
                cached=outcome.cached,
                purpose=purpose,
            )
        )
        entry.probes = len(entry.trace)
        self._update()

    def _static(self, combo: Combo, outcomes: dict[int, ProbeOutcome]) -> dict[str, int]:
        measured = [o for o in outcomes.values() if o.fits and o.param_bytes]
        if measured:
            o = measured[-1]
            return {
                "parameters": o.param_bytes,
                "gradients": o.grad_bytes,
                "optimizer_state": o.optimizer_state_bytes,
            }
        device = self.session.device
        assert device is not None
        shapes = [tuple(s) for s in device.param_shapes]
        elem = 2 if combo.precision == "bf16-true" else 4
        params = device.param_count * elem
        return {
            "parameters": params,
            "gradients": params,
            "optimizer_state": optimizer_state_bytes(combo.optimizer, shapes, elem),
        }

    def _prior(self, combo: Combo) -> reuse.Prediction | None:
        device = self.session.device
        assert device is not None
        shapes = [tuple(s) for s in device.param_shapes]
        learned = [
            reuse.Learned(
                k.combo.precision, k.combo.optimizer, k.combo.recompute, k.model.intercept, k.model.slope
            )
            for k in self.known
            if k.model is not None
        ]
        return reuse.predict(combo.precision, combo.optimizer, combo.recompute, learned, shapes)

    def _calibrate(
        self, prediction: reuse.Prediction | None, probe: Callable[[int], Observation]
    ) -> tuple[Affine | None, list[Observation]]:
        """Turn a prediction into the search's prior, spending one probe when its slope is only a guess.

        A guessed slope (another precision or recomputation setting) is the weak half of the line;
        the intercept (static memory, moved analytically) is the strong one. So probe where the
        guess puts the boundary and take the slope from that point and the intercept.
        """
        if prediction is None:
            return None, []
        line = Affine(prediction.intercept, prediction.slope)
        if prediction.slope_known:
            return line, []
        device = self.session.device
        assert device is not None
        m, top = self.options.batch_multiple, self.options.max_batch_size
        guess = line.predict_max(device.budget_bytes)
        if guess is None:
            return None, []
        # Below the guess, where a guessed slope usually still fits: a fit gives the slope from the
        # intercept over most of the range; a miss at the guess itself would only bound it.
        batch = min(max(int(CALIBRATE_AT * guess) // m * m, m), top // m * m)
        first = probe(batch)
        if first.fits and first.peak_bytes is not None and first.peak_bytes > line.intercept:
            line = Affine(line.intercept, (first.peak_bytes - line.intercept) / batch)
        return line, [first]

    # -- plan and choice ------------------------------------------------------------------------

    def _plan_and_choose(self, combos: list[Combo]) -> None:
        opts = self.options
        candidates: list[Candidate] = []
        plans: dict[int, Plan] = {}
        for index, (combo, entry) in enumerate(zip(combos, self.result.combinations)):
            if entry.max_batch_size is None or entry.status not in ("exact", "capped"):
                candidates.append(Candidate(index, None, None, None))
                continue
            plan = plan_accumulation(
                entry.max_batch_size, opts.global_batch_size, opts.world_size, opts.batch_multiple
            )
            plans[index] = plan
            sps = (
                self._throughput_at(combo, entry, plan.micro_batch_size)
                if opts.objective == "throughput"
                else entry.samples_per_second
            )
            candidates.append(Candidate(index, entry.max_batch_size, sps, plan))
        winner = choose(candidates, opts.objective)
        if winner is None:
            return
        entry = self.result.combinations[winner]
        plan = plans[winner]
        self.result.chosen = Chosen(
            precision=entry.precision,
            optimizer=entry.optimizer,
            recompute=entry.recompute,
            micro_batch_size=plan.micro_batch_size,
            accumulation_steps=plan.accumulation_steps,
            world_size=plan.world_size,
            global_batch_size=plan.global_batch_size,
            requested_global_batch_size=plan.requested_global_batch_size,
            exact=plan.exact,
            note=plan.note,
        )

    def _throughput_at(self, combo: Combo, entry: ComboResult, micro: int) -> float | None:
        """Samples per second at the planned micro-batch (measured now if no probe ran there)."""
        for record in reversed(entry.trace):
            if record.batch_size == micro and record.kind == "fits" and record.samples_per_second:
                if micro != entry.max_batch_size:
                    entry.samples_per_second = record.samples_per_second
                return record.samples_per_second
        outcome = self.session.probe(
            combo, micro, min_steps=self.options.steps, max_steps=self.options.max_steps
        )
        self._record(entry, outcome, "throughput")
        if outcome.fits:
            entry.samples_per_second = outcome.samples_per_second
        return outcome.samples_per_second

    def _update(self) -> None:
        self.result.probes = sum(1 for c in self.result.combinations for p in c.trace if not p.cached)
        self.result.wall_seconds = round(time.perf_counter() - self.started, 3)
        if self.on_update:
            self.on_update(self.result)


def _observation(outcome: ProbeOutcome) -> Observation:
    return Observation(
        batch_size=outcome.batch_size,
        fits=outcome.fits,
        peak_bytes=outcome.peak_bytes if outcome.fits else None,
        kind=outcome.kind,
        samples_per_second=outcome.samples_per_second,
    )


def describe_outcome(outcome: ProbeOutcome) -> dict[str, Any]:
    """A compact view of an outcome for human progress lines."""
    return {"batch": outcome.batch_size, "kind": outcome.kind, "peak": format_bytes(outcome.peak_bytes)}
