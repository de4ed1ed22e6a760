"""Would the plan survive the data? A tune over sequence lengths, checked against the real lengths.

:func:`overflow_report` reads a result written by ``autobatch tune --seq-len A --seq-len B`` (its chosen
combination, the combination's memory surface, the line its maxima are measured against and its token
budget), reads the lengths of the data (:mod:`autobatch.records.data_lengths`) and counts the batches that
would run out of memory under padding and under token-budget batching (:mod:`autobatch.core.overflow`).
``autobatch lengths`` shows it; it runs no probe and imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from autobatch.core.lengths import Surface
from autobatch.core.overflow import Measured, Memory, Overflow, overflow
from autobatch.core.space import ident_of
from autobatch.errors import UsageError
from autobatch.records.data_lengths import DataLengths, read_lengths
from autobatch.records.liveness import unfinished

Batching = Literal["both", "padding", "tokens"]
FIX = "autobatch tune SCRIPT --seq-len A --seq-len B (two lengths or more, the longest the job will see among them)"


@dataclass(frozen=True)
class Plan:
    """What a result says about lengths: the chosen combination, its surface and budget, the line, and what its
    probes measured at each searched length."""

    combination: dict[str, Any]  # key, precision, optimizer, recompute, recompute_level, compile
    micro_batch_size: int
    surface: Surface
    token_budget: int | None
    line_bytes: int
    plan_seq_len: int
    seq_lens: list[int]
    measured: tuple[Measured, ...] = ()


@dataclass(frozen=True)
class LengthsReport:
    """The figures of ``autobatch lengths`` (:meth:`to_dict` is its ``--json``)."""

    result: str
    data: DataLengths
    plan: Plan
    batch_size: int | None
    batch_size_from: str  # "chosen" | "--batch-size"
    max_tokens: int | None
    max_tokens_from: str | None  # "token_budget" | "--max-tokens" | None (no budget)
    overflow: Overflow
    notes: list[str] = field(default_factory=list)
    raised_bytes: float = (
        0.0  # the surface raised to pass at or over every peak measured (core.overflow.Memory)
    )

    def to_dict(self) -> dict[str, Any]:
        spread, padded, tokens = self.overflow.spread, self.overflow.padded, self.overflow.tokens
        lengths = self.data.lengths
        padding = None if padded is None else {**padded.to_dict(), "batch_size_from": self.batch_size_from}
        by_tokens = None if tokens is None else {**tokens.to_dict(), "max_tokens_from": self.max_tokens_from}
        return {
            "result": self.result,
            "data": self.data.source,
            "combination": self.plan.combination,
            "plan_seq_len": self.plan.plan_seq_len,
            "seq_lens": self.plan.seq_lens,
            "line_bytes": self.plan.line_bytes,
            "surface": {**self.plan.surface.to_dict(), "raised_bytes": round(self.raised_bytes)},
            "distribution": {
                **spread.to_dict(),
                "longer_than_plan": sum(1 for n in lengths if n > self.plan.plan_seq_len),
                "longer_than_searched": sum(1 for n in lengths if n > max(self.plan.seq_lens, default=0)),
            },
            "padding": padding,
            "tokens": by_tokens,
            "overflows": self.overflow.overflows,
            "notes": self.notes,
        }


def read_plan(result: str | Path) -> Plan:
    """The chosen combination of a result tuned over lengths, with its surface (a usage error, naming the fix,
    for a result without lengths, without a choice, or with a surface fitted from one length)."""
    from autobatch.records.result import TuneResult, nothing_chosen

    loaded = TuneResult.load(result)
    if loaded.chosen is None:
        unfinished_because = unfinished(loaded.to_dict())
        if unfinished_because is not None:
            raise UsageError(
                f"{result} has no chosen combination: {unfinished_because}",
                hint="run the same `autobatch tune` again (once what a failed one reported is fixed; a live one: wait "
                "for it): it resumes from the probes it already measured",
            )
        failure = nothing_chosen(
            loaded, int(loaded.device.get("budget_bytes") or 0)
        )  # the tune's own error, again
        raise UsageError(
            f"{result} has no chosen combination: {failure.message}", hint=f"{failure.hint}; then count again"
        )
    if loaded.lengths is None:
        raise UsageError(f"{result} was tuned without sequence lengths: it has no memory surface", hint=FIX)
    chosen, table = loaded.chosen, loaded.lengths
    ident = ident_of(chosen)
    entry = next((s for s in table.surfaces if ident_of(s) == ident), None)
    name = ident.name
    if entry is None or not entry.get("surface"):
        raise UsageError(f"{result} has no memory surface for the chosen {name}", hint=FIX)
    surface = _surface(entry["surface"], result)
    if len(set(surface.lengths)) < 2:
        told = ", ".join(map(str, surface.lengths)) or "no length"
        none_fit = sorted(
            r.seq_len for r in table.maxima if r.seq_len and r.status == "infeasible" and ident_of(r) == ident
        )
        why, hint = "", FIX
        if none_fit:  # such a length has no line: a search that fits no batch measures none
            why = f" (not one sample fits at {', '.join(map(str, none_fit))} tokens)"
            hint = f"autobatch tune SCRIPT --seq-len A --seq-len B, with lengths under {none_fit[0]} at which a batch fits"
        raise UsageError(
            f"the surface of {name} in {result} was fitted from one length ({told} tokens){why}: one length "
            "cannot tell the memory per token from the attention's memory per pair of tokens",
            hint=hint,
        )
    return Plan(
        combination={
            "key": name,
            "precision": ident.precision,
            "optimizer": ident.optimizer,
            "recompute": chosen.recompute,
            "recompute_level": ident.level,
            "compile": ident.compile,
        },  # fmt: skip
        micro_batch_size=chosen.micro_batch_size,
        surface=surface,
        token_budget=entry.get("token_budget"),
        line_bytes=table.line_bytes,
        plan_seq_len=table.plan_seq_len,
        seq_lens=sorted(table.seq_lens),
        measured=table.measured(ident),
    )


def _surface(data: dict[str, Any], result: str | Path) -> Surface:
    try:
        surface = Surface.from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"{result}: the surface cannot be read ({exc})", hint=FIX) from None
    if surface.per_token < 0 or surface.per_token_squared < 0 or surface.slope(1) <= 0:
        raise UsageError(
            f"{result}: the surface does not grow with the length (bytes_per_token {surface.per_token:g}, "
            f"bytes_per_token_squared {surface.per_token_squared:g})",
            hint=FIX,
        )
    return surface


def overflow_report(
    data: str | Path,
    result: str | Path,
    *,
    field: str | None = None,
    column: str | None = None,
    batch_size: int | None = None,
    max_tokens: int | None = None,
    batching: Batching = "both",
) -> LengthsReport:
    """The batches of ``data`` that the chosen plan of ``result`` would not survive (see the module)."""
    for flag, value in (("--batch-size", batch_size), ("--max-tokens", max_tokens)):
        if value is not None and value < 1:
            raise UsageError(
                f"{flag} must be at least 1, found {value}", hint=f"drop {flag} to use the result's"
            )
    plan = read_plan(result)
    read = read_lengths(data, field=field, column=column)
    batch = batch_size if batch_size is not None else plan.micro_batch_size
    tokens = max_tokens if max_tokens is not None else plan.token_budget
    notes = []
    if batching != "padding" and tokens is None:
        notes.append("no token budget in the result (no length was measured): give --max-tokens T")
    memory = Memory.of(plan.surface, plan.line_bytes, plan.measured)
    found = overflow(
        read.lengths,
        memory,
        batch_size=batch if batching != "tokens" else None,
        max_tokens=tokens if batching != "padding" else None,
    )
    longest = max(plan.seq_lens, default=plan.plan_seq_len)
    tokens_from = "--max-tokens" if max_tokens is not None else "token_budget" if tokens is not None else None
    if found.spread.max > longest:
        notes.append(
            f"the data reaches {found.spread.max} tokens, past the longest length searched ({longest}): the surface "
            f"extrapolates there; search it to measure it (--seq-len {found.spread.max})"
        )
    return LengthsReport(
        result=str(result),
        data=read,
        plan=plan,
        batch_size=batch,
        batch_size_from="--batch-size" if batch_size is not None else "chosen",
        max_tokens=tokens,
        max_tokens_from=tokens_from,
        overflow=found,
        notes=notes,
        raised_bytes=memory.raised_bytes,
    )
