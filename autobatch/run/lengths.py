"""A tune over sequence lengths: every combination's maximum at every length the job will see.

The grid (precision x optimizer x recomputation) is searched, planned and chosen at the plan's length
(``plan.seq_len``, by default the longest). Then every combination that found a maximum there is searched at
each further length, in :func:`autobatch.core.lengths.search_order`: the farthest length next (the widest base
for the surface), then those between. Each search starts from the surface fitted over the lengths measured so
far (:func:`autobatch.core.lengths.prior_line`), so that it needs about two probes and its confirmation, and
verifies it as any prior: a wrong surface costs probes, never correctness.

At the end, per combination: the surface, its fit error against the measured maxima, the token budget (the
most tokens per micro-batch that fit at every searched length), and the maxima at the powers of two between
the searched lengths, answered from the surface and marked ``predicted`` (never ``exact``).
"""

from __future__ import annotations

from collections.abc import Callable

from autobatch.core import lengths as surfaces
from autobatch.core.lengths import Line
from autobatch.core.model import Affine
from autobatch.core.overflow import Memory
from autobatch.core.reuse import Prediction
from autobatch.core.space import Combo, Ident
from autobatch.core.units import format_bytes
from autobatch.records.result import ComboResult, Lengths, TuneResult

Key = Ident


def plan_lengths(seq_lens: tuple[int, ...], plan_seq_len: int | None) -> tuple[tuple[int, ...], int | None]:
    """The lengths to search (ascending, the plan's among them) and the plan's length (None: no lengths)."""
    if plan_seq_len is None and not seq_lens:
        return (), None
    plan = plan_seq_len if plan_seq_len is not None else max(seq_lens)
    return tuple(sorted({*seq_lens, plan})), plan


class LengthSearch:
    """The lines measured at each length, the priors they give, and the table they end in."""

    def __init__(
        self, result: TuneResult, seq_lens: tuple[int, ...], plan: int, line_bytes: int, multiple: int
    ):
        self.result = result
        self.plan = plan
        self.line_bytes = line_bytes
        self.lines: dict[Key, dict[int, tuple[Line, bool]]] = {}  # (line, of_readings) per length
        result.lengths = Lengths(list(seq_lens), plan, line_bytes, multiple)

    def learn(self, combo: Combo, model: Affine | None, exact: int | None = None) -> None:
        """Keep one search's line at ``combo.seq_len``. With the ``exact`` maximum there, the line is drawn
        through the boundary (halfway between the maximum and the next batch) from the plan's intercept: the
        static memory does not change with the length, and a search that ends on a fit and a miss the next
        batch up has measured the miss only where the probe stopped at the line, so their secant can be far
        too shallow (seen: half the slope), while the maximum is exact."""
        if model is None or combo.seq_len is None:
            return
        known = self.lines.setdefault(_key(combo), {})
        plan = known.get(self.plan)
        intercept = model.intercept if plan is None or combo.seq_len == self.plan else plan[0].intercept
        line = Line(combo.seq_len, model.intercept, model.slope)
        if exact and self.line_bytes > intercept:
            line = Line(combo.seq_len, intercept, (self.line_bytes - intercept) / (exact + 0.5))
        known[combo.seq_len] = (line, model.of_readings)

    def prior(self, combo: Combo) -> Prediction | None:
        """The line the surface predicts at a length other than the plan's (None at the plan's: the grid's
        priors apply there)."""
        known, seq_len = self.lines.get(_key(combo), {}), combo.seq_len
        if seq_len is None or seq_len == self.plan or not known:
            return None
        lines = [line for line, _ in known.values()]
        predicted = surfaces.prior_line(lines, seq_len)
        if predicted is None:
            return None
        intercept, slope, slope_known = predicted
        nearest = min(lines, key=lambda line: abs(line.seq_len - seq_len))
        steepest = None
        if not slope_known and seq_len > nearest.seq_len:  # all of it quadratic: an upper bound
            steepest = nearest.slope * (seq_len / nearest.seq_len) ** 2
        told = " and ".join(str(n) for n in sorted(known))
        return Prediction(
            intercept,
            slope,
            f"the surface over {told} tokens" + ("" if slope_known else " (scaled linearly)"),
            slope_known=slope_known,
            base_slope=steepest,
            of_readings=known[nearest.seq_len][1],
        )

    def run(self, combos: list[Combo], search: Callable[[Combo, ComboResult], None]) -> None:
        """Search every further length of every combination that found a maximum at the plan's, in order."""
        table = self.result.lengths
        assert table is not None
        table.maxima.extend(self.result.combinations)
        order = surfaces.search_order(table.seq_lens, self.plan)[1:]
        for combo, entry in zip(combos, self.result.combinations, strict=False):
            for seq_len in order:
                row = ComboResult.of(combo.at(seq_len))
                row.recompute_blocks = dict(entry.recompute_blocks)
                table.maxima.append(row)
                if not entry.answered:
                    row.status = "skipped"
                    row.reason = f"not searched: {entry.status} at the plan's {self.plan} tokens"
                    continue
                search(combo.at(seq_len), row)
        self.finish(combos)

    def finish(self, combos: list[Combo]) -> None:
        """The surfaces, fit errors and token budgets, and the predicted rows between searched lengths."""
        table = self.result.lengths
        assert table is not None
        table.surfaces = []
        table.maxima = [row for row in table.maxima if row.status != "predicted"]
        for combo in combos:
            rows = [r for r in table.maxima if _key(r) == _key(combo)]
            measured = {r.seq_len: r.max_batch_size for r in rows if r.answered and r.seq_len}
            surface = surfaces.fit(line for line, _ in self.lines.get(_key(combo), {}).values())
            entry: dict[str, object] = {**combo.at(None).to_dict(), "surface": None, "fit_error": None}
            entry["token_budget"] = surfaces.token_budget({k: v for k, v in measured.items() if v})
            if surface is not None:
                entry["surface"] = surface.to_dict()
                error = surfaces.fit_error(surface, measured, table.line_bytes, table.batch_multiple)  # type: ignore[arg-type]
                entry["fit_error"] = None if error is None else round(error, 4)
                entry["attention_share"] = round(surface.attention_share(self.plan), 4)
                table.maxima.extend(self._predicted(combo, surface, measured))  # type: ignore[arg-type]
            table.surfaces.append(entry)
        index = {_key(c): i for i, c in enumerate(combos)}
        table.maxima.sort(key=lambda r: (index.get(_key(r), len(index)), r.seq_len or 0))

    def unmoved(self, combos: list[Combo]) -> list[str]:
        """A warning for each combination whose memory per sample did not move with the length
        (:func:`autobatch.core.lengths.unmoved`): its maxima are those of shorter batches than their lengths."""
        warnings = []
        for combo in combos:
            found = surfaces.unmoved(line for line, _ in self.lines.get(_key(combo), {}).values())
            if found is None:
                continue
            short, long = found
            warnings.append(
                f"{_key(combo).name}: the memory per sample hardly moved with the length ({format_bytes(short.slope)} at "
                f"{short.seq_len} tokens, {format_bytes(long.slope)} at {long.seq_len}): the batches may never have "
                f"reached {long.seq_len} tokens (data shorter than the length, or truncated to a maximum of the "
                "script's own), and a maximum holds only for batches as short as those measured; give every probe "
                "batches of the length it asks for ({seq_len} tokens a sequence)"
            )
        return warnings

    def _predicted(
        self, combo: Combo, surface: surfaces.Surface, measured: dict[int, int]
    ) -> list[ComboResult]:
        """The maxima between the searched lengths, as ``autobatch lengths`` reads them: from the surface raised
        to pass at or over every peak measured, within what the probes measured (:class:`Memory`)."""
        table = self.result.lengths
        assert table is not None
        if len(measured) < 2:
            return []  # one length: no surface to answer another from
        memory = Memory.of(surface, table.line_bytes, table.measured(_key(combo)))
        raised = (
            f", raised {format_bytes(memory.raised_bytes)} to its measured peaks"
            if memory.raised_bytes
            else ""
        )
        rows = []
        for seq_len in surfaces.between(table.seq_lens):
            row = ComboResult.of(combo.at(seq_len), status="predicted")
            row.max_batch_size = memory.max_batch(seq_len, table.batch_multiple) or None
            row.reason = (
                f"predicted from the surface fitted at {', '.join(map(str, sorted(measured)))} tokens{raised}"
            )
            rows.append(row)
        return rows


def _key(item: Combo | ComboResult) -> Key:
    return item.ident
