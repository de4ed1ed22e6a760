"""``autobatch lengths DATA``: the share of the data's batches that the tuned plan would not survive.

:mod:`autobatch.service.lengths` reads DATA's lengths and counts the batches that overflow the result's memory
surface, under padding and under a token budget; this command prints the table to stderr, ``--json`` on
stdout, and with ``--fail-on-overflow`` exits 5 when a batch would overflow. Every option and figure:
docs/commands.md (``lengths``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from autobatch.cli import options as opt
from autobatch.cli.app import app, console, stdout_write
from autobatch.cli.progress import Output
from autobatch.core.units import format_bytes
from autobatch.errors import EXIT_OOM, UsageError

if TYPE_CHECKING:
    from rich.table import Table

    from autobatch.service.lengths import LengthsReport

BATCHING = ("both", "padding", "tokens")


@app.command("lengths")
def lengths(
    data: Path = typer.Argument(
        ...,
        help="The data's lengths: a file of one length a line, JSON Lines (.jsonl) with a token-count field, "
        "or a folder written by a Hugging Face data set's save_to_disk.",
        show_default=False,
    ),
    result: Annotated[
        Optional[Path],
        typer.Option(
            "--result", "-r", help="A result of `autobatch tune --seq-len ...` (default: the result setting)."
        ),
    ] = None,
    config: opt.Config = None,
    field: Annotated[
        Optional[str],
        typer.Option(
            "--field",
            help="JSON Lines: the field with the token count or the token list "
            "(default: the first of length, num_tokens, n_tokens, tokens, seq_len, input_ids).",
        ),
    ] = None,
    column: Annotated[
        Optional[str],
        typer.Option(
            "--column", help="A saved data set: the column of token lists or counts (default input_ids)."
        ),
    ] = None,
    batch_size: Annotated[
        Optional[int],
        typer.Option(
            "--batch-size", "-b", min=1, help="The micro-batch under padding (default: the chosen one)."
        ),
    ] = None,
    max_tokens: Annotated[
        Optional[int],
        typer.Option(
            "--max-tokens", min=1, help="The token budget of a batch (default: the result's token budget)."
        ),
    ] = None,
    batching: Annotated[
        str,
        typer.Option("--batching", help="Which batching to count: both, padding or tokens."),
    ] = "both",
    fail_on_overflow: Annotated[
        bool,
        typer.Option(
            "--fail-on-overflow",
            help="Exit 5 when any batch would run out of memory (default: exit 0 and warn).",
        ),
    ] = False,
    as_json: opt.Json = False,
    verbose: opt.Verbose = False,
    quiet: opt.Quiet = False,
) -> None:
    """Count the batches of your data that the tuned plan would not survive (padding and token budget)."""
    from autobatch.service.lengths import overflow_report

    if batching not in BATCHING:
        raise UsageError(f"--batching: expected one of {', '.join(BATCHING)}, found {batching!r}",
                         hint="--batching padding (a DataLoader that pads) or tokens (a max_tokens sampler)")  # fmt: skip
    report = overflow_report(
        data,
        result if result is not None else _default_result(config),
        field=field,
        column=column,
        batch_size=batch_size,
        max_tokens=max_tokens,
        batching=batching,  # type: ignore[arg-type]
    )
    out = Output(as_json=as_json)
    _print(report, out)
    if as_json:
        stdout_write(json.dumps(report.to_dict(), indent=2))
    if fail_on_overflow and report.overflow.overflows:
        raise typer.Exit(EXIT_OOM)


def _default_result(config: Path | None) -> str:
    """Where ``tune`` writes its result under these settings (``autobatch-result.json`` by default)."""
    from autobatch.settings import load_settings

    return load_settings(config=config).output.result


def _print(report: LengthsReport, out: Output) -> None:
    plan, spread = report.plan, report.overflow.spread
    name = plan.combination["key"]
    out.status(
        f"{report.data.describe()}: {spread.count:,} sequences; {report.result}: {name}, plan at "
        f"{plan.plan_seq_len} tokens, searched {', '.join(map(str, plan.seq_lens))}"
    )
    longer = sum(1 for n in report.data.lengths if n > plan.plan_seq_len)
    out.status(
        f"lengths (tokens): mean {spread.mean:.0f}, p50 {spread.p50}, p90 {spread.p90}, p99 {spread.p99}, "
        f"max {spread.max} ({longer:,} longer than the plan's {plan.plan_seq_len})"
    )
    if not out.quiet:
        console.print(_table(report))
    for note in report.notes:
        out.status(f"note: {note}")
    if report.overflow.overflows:
        out.warning(
            "some batches would run out of memory: cap the length (truncate or drop the long sequences), batch by "
            f"a token budget, or plan at the data's longest length (autobatch tune --plan-seq-len {spread.max}); "
            "--fail-on-overflow makes this exit 5"
        )
    out.summary(summary(report))


def _table(report: LengthsReport) -> Table:
    from rich.table import Table

    padded, tokens = report.overflow.padded, report.overflow.tokens
    table = Table(title=f"batches that would run out of memory (line {format_bytes(report.plan.line_bytes)})")
    for heading in ("batching", "batches", "out of memory", "share", "shuffled", "fits up to (tokens)"):
        table.add_column(heading, justify="left" if heading == "batching" else "right")
    if padded is not None:
        table.add_row(
            f"padding, batch {padded.batch_size}",
            f"{padded.batches:,}",
            f"{padded.overflowing:,}",
            percent(padded.share),
            percent(padded.shuffled_share),
            str(padded.longest_length),
        )
    if tokens is not None:
        table.add_row(
            f"token budget {tokens.max_tokens:,}",
            f"{tokens.batches:,}",
            f"{tokens.overflowing:,}" + (f" ({tokens.unbatchable:,} too long)" if tokens.unbatchable else ""),
            percent(tokens.share),
            "-",
            str(tokens.longest_length),
        )
    return table


def summary(report: LengthsReport) -> str:
    """One line: the share of batches that would run out of memory, under each batching shown."""
    padded, tokens = report.overflow.padded, report.overflow.tokens
    parts = []
    if padded is not None:
        first = (
            f" (the first is batch {padded.first_overflowing_batch:,}, counting from 0)"
            if padded.first_overflowing_batch is not None
            else ""
        )
        count = report.overflow.spread.count
        order = (
            f"in file order{first}, {percent(padded.shuffled_share)} expected when shuffled"
            if count >= padded.batch_size
            else f"(the data, {count:,} sequence{'s' if count != 1 else ''}, is one batch of {count:,} in any order)"
        )
        parts.append(
            f"{percent(padded.share)} of batches ({padded.overflowing:,} of {padded.batches:,}) would run out of "
            f"memory under padding at batch {padded.batch_size} {order}; "
            + (
                f"the longest length batch {padded.batch_size} survives is {tokens_of(padded.longest_length)}"
                if padded.longest_length
                else f"batch {padded.batch_size} survives no length, not one token"
            )
        )
    if tokens is not None:
        parts.append(
            f"{percent(tokens.share)} ({tokens.overflowing:,} of {tokens.batches:,}) under a token budget of "
            f"{tokens.max_tokens:,}"
            + (f", {tokens.unbatchable:,} of them one sequence longer than it" if tokens.unbatchable else "")
            + (
                f"; a full budget survives every length up to {tokens_of(tokens.longest_length)} a sequence"
                if tokens.longest_length
                else "; a full budget survives no length, not one token"
            )
        )
    return "autobatch lengths: " + ("; ".join(parts) if parts else "nothing to count (no token budget)")


def tokens_of(count: int) -> str:
    return f"{count:,} token{'s' if count != 1 else ''}"


def percent(share: float) -> str:
    """``0.3 %``; a share too small for one decimal keeps two significant digits (never ``0.0 %``)."""
    if share == 0:
        return "0 %"
    value = share * 100
    return f"{value:.1f} %" if value >= 0.1 else f"{value:.2g} %"


__all__ = ["lengths", "percent", "summary"]
