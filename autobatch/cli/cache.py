"""``autobatch cache list | show KEY | clear [--older-than AGE]``: the cache folder's entries.

The folder is the ``cache_dir`` setting's (``[probe] cache_dir`` in autobatch.toml, or
``AUTOBATCH_CACHE_DIR``), else the user cache folder. A KEY may be shortened to any unique prefix.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from autobatch.cache.journal import parsed_key
from autobatch.cli import options as opt
from autobatch.cli.app import app, console, stdout_write
from autobatch.cli.progress import Output
from autobatch.core.units import format_bytes
from autobatch.errors import UsageError

if TYPE_CHECKING:
    from autobatch.cache import CacheFolder
    from autobatch.cache.manage import Entry

cache_app = typer.Typer(
    help="List, show and clear the probe cache (stored results, probe journals, runtime evidence).",
    no_args_is_help=True,
)
app.add_typer(cache_app, name="cache")


@cache_app.callback()
def _cache(verbose: opt.Verbose = False, quiet: opt.Quiet = False) -> None:
    """-v/-q between ``cache`` and its subcommand too."""


def _folder(config: Path | None) -> CacheFolder:
    from autobatch.cache import CacheFolder

    settings = opt.load({"config": config})
    return CacheFolder(settings.probe.cache_dir, warn=Output().warning)


@cache_app.command("list")
def list_command(
    config: opt.Config = None,
    as_json: bool = typer.Option(False, "--json", help="Print the entries as JSON on stdout."),
    verbose: opt.Verbose = False,
    quiet: opt.Quiet = False,
) -> None:
    """Every entry: key, kind (result, journal, damaged), script, device, age, size."""
    from autobatch.cache.manage import entries

    folder = _folder(config)
    found = entries(folder)
    if not Output().quiet and found:
        table = Table(title=f"autobatch cache: {folder.path}")
        for column in ("key", "kind", "script", "device", "last used", "size", "detail"):
            table.add_column(column, justify="right" if column in ("last used", "size") else "left")
        for e in found:
            table.add_row(
                e.key, e.kind, escape(e.script or "-"), escape(e.device or "-"), _ago(e.age), format_bytes(e.size),
                escape(e.detail),
            )  # fmt: skip
        console.print(table)
    total = sum(e.size for e in found)
    Output(as_json=as_json).summary(f"{len(found)} cache entries, {format_bytes(total)}, in {folder.path}")
    if as_json:
        stdout_write(
            json.dumps({"folder": str(folder.path), "entries": [e.summary() for e in found]}, indent=2)
        )


@cache_app.command("show")
def show_command(
    key: str = typer.Argument(..., help="A key from `autobatch cache list` (a unique prefix will do)."),
    config: opt.Config = None,
    as_json: bool = typer.Option(False, "--json", help="Print the entries as JSON on stdout."),
    verbose: opt.Verbose = False,
    quiet: opt.Quiet = False,
) -> None:
    """What an entry was computed from and what it holds."""
    from autobatch.cache.manage import find

    folder = _folder(config)
    found = find(folder, key)
    if not found:
        raise UsageError(
            f"no cache entry {key!r} in {folder.path}", hint="`autobatch cache list` shows the keys"
        )
    if len({e.key for e in found}) > 1:
        keys = ", ".join(sorted({e.key for e in found}))
        raise UsageError(f"{key!r} names more than one entry: {keys}", hint="give more of the key")
    for entry in found:
        _show(entry)
    Output(as_json=as_json).summary(f"{found[0].key}: " + "; ".join(f"{e.kind} ({e.detail})" for e in found))
    if as_json:
        stdout_write(json.dumps([{**e.summary(), "content": e.data} for e in found], indent=2))


@cache_app.command("clear")
def clear_command(
    older_than: Optional[str] = typer.Option(
        None, "--older-than", help="Only entries last used longer ago than AGE (90s, 30m, 12h, 7d, 2w)."
    ),
    config: opt.Config = None,
    verbose: opt.Verbose = False,
    quiet: opt.Quiet = False,
) -> None:
    """Remove every entry, or those older than AGE."""
    from autobatch.cache.manage import clear, parse_age

    age = parse_age(older_than) if older_than is not None else None
    folder = _folder(config)
    removed = clear(folder, age)
    out = Output()
    for entry in removed:
        out.status(
            f"removed {entry.kind} {entry.key} ({format_bytes(entry.size)}, last used {_ago(entry.age)})"
        )
    which = f" older than {older_than}" if older_than else ""
    out.summary(
        f"removed {len(removed)} cache entries{which} ({format_bytes(sum(e.size for e in removed))}) from {folder.path}"
    )


def _show(entry: Entry) -> None:
    out = Output()
    out.status(
        f"{entry.kind} {entry.key}: {entry.path} ({format_bytes(entry.size)}, last used {_ago(entry.age)})"
    )
    if out.quiet:
        return
    if entry.kind == "result":
        _show_result(entry.data)
    elif entry.kind == "journal":
        _show_journal(entry.data)
    elif entry.kind == "evidence":
        _show_evidence(entry.data)
    else:
        console.print(f"  {escape(entry.detail)}")


def _show_result(data: dict[str, Any]) -> None:
    from autobatch.cli.tune import print_chosen, print_table
    from autobatch.records.result import TuneResult

    inputs = data.get("inputs", {})
    console.print(f"made {data.get('made')}; computed from:", highlight=False)
    for path, digest in inputs.get("sources", {}).items():
        console.print(f"  source {escape(path)} sha256 {digest[:16]}", highlight=False)
    for part in ("script_args", "settings", "device", "versions"):
        console.print(f"  {part}: {escape(json.dumps(inputs.get(part), sort_keys=True))}", highlight=False)
    result = TuneResult.from_dict(data["result"])
    print_table(result)
    print_chosen(result)


def _show_journal(data: dict[str, Any]) -> None:
    meta = data.get("meta", {})
    console.print(f"  {escape(json.dumps(meta, sort_keys=True))}", highlight=False)
    table = Table()
    for column in ("precision", "optimizer", "recompute", "batch", "steps", "kind", "peak"):
        table.add_column(column)
    for key, outcome in sorted(data.get("probes", {}).items(), key=lambda item: str(parsed_key(item[0]))):
        (precision, optimizer, level, compiled, seq_len), batch, (low, high) = parsed_key(key)
        extra = (" +compile" if compiled else "") + (f" at {seq_len}" if seq_len else "")
        table.add_row(
            precision, optimizer, level + extra, str(batch), f"{low}-{high}", outcome.get("kind"),
            format_bytes(outcome.get("peak_bytes")) if outcome.get("peak_bytes") else "-",
        )  # fmt: skip
    console.print(table)


def _show_evidence(data: dict[str, Any]) -> None:
    """What jobs run with this tune saw (``autobatch run``, the in-loop guard), one line an event."""
    from autobatch.cache.evidence import Event, summary

    events = [Event.from_dict(e) for e in data.get("events", [])]
    for event in events:
        console.print(f"  {escape(event.line())}", highlight=False, soft_wrap=True)
    said = summary(events)
    if said:
        console.print(f"  {escape(said)}", highlight=False, soft_wrap=True)


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.0f} h ago"
    return time.strftime("%Y-%m-%d", time.localtime(time.time() - seconds))
