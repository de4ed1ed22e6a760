"""Terminal output of explain and estimate: a compact bar of the breakdown and rich tables (stderr)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from autobatch.core.space import ident_of
from autobatch.core.units import format_bytes
from autobatch.explain.pure.records import CATEGORIES, CATEGORY_HELP

#: One colour per category (and the residual), shared with the plots' palette order.
COLOURS: dict[str, str] = {
    "baseline": "grey50",
    "parameters": "blue",
    "buffers": "cyan",
    "gradients": "magenta",
    "optimizer_state": "red",
    "inputs": "bright_black",
    "activations": "green",
    "autocast_copies": "bright_green",
    "temporaries": "yellow",
    "ddp_buckets": "bright_magenta",
    "runtime_overhead": "bright_red",
    "residual": "white",
}
MODULE_ROWS = 15


def segments(categories: dict[str, int], residual: int) -> list[tuple[str, int]]:
    """(name, bytes) in display order, zero categories left out, the residual last."""
    out = [(name, int(categories.get(name, 0))) for name in CATEGORIES if categories.get(name, 0) > 0]
    if residual:
        out.append(("residual", int(residual)))
    return out


def category_bar(categories: dict[str, int], residual: int, budget: int | None, width: int = 64) -> Text:
    """A one-line bar of the peak by category, scaled to the budget when the peak fits inside it."""
    parts = segments(categories, residual)
    total = sum(max(0, b) for _, b in parts)
    scale = max(total, budget or 0) or 1
    bar = Text()
    used = 0
    for name, nbytes in parts:
        cells = round(max(0, nbytes) / scale * width)
        bar.append("█" * cells, style=COLOURS.get(name, "white"))
        used += cells
    if budget and budget > total:
        bar.append("░" * max(0, width - used), style="grey30")
    bar.append(f"  {format_bytes(total)}" + (f" of {format_bytes(budget)}" if budget else ""))
    return bar


def print_breakdown(console: Console, report: dict[str, Any]) -> None:
    categories, residual = report["categories"], report["residual_bytes"]
    peak = report["peak_bytes"] or 1
    console.print(category_bar(categories, residual, report.get("budget_bytes")))
    table = Table(title=f"peak of batch {report['batch_size']} by category ({report.get('peak_phase', '')})")
    for column, justify in (("category", "left"), ("bytes", "right"), ("of peak", "right"), ("what", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for name, nbytes in segments(categories, residual):
        table.add_row(
            Text("■ ", style=COLOURS.get(name, "white")) + Text(name),
            format_bytes(nbytes),
            f"{nbytes / peak:.1%}",
            CATEGORY_HELP.get(name, ""),
        )
    table.add_row("[bold]measured peak[/]", f"[bold]{format_bytes(report['peak_bytes'])}[/]", "100%", "")
    console.print(table)


def print_modules(console: Console, modules: list[dict[str, Any]], limit: int = MODULE_ROWS) -> None:
    if not modules:
        return
    table = Table(
        title=f"per module (own figures; largest {min(limit, len(modules))} of {len(modules)} by memory)"
    )
    columns = ("module", "type", "params", "param+grad+opt", "saved for bwd", "output", "fwd MACs")
    for column in columns:
        table.add_column(column, justify="left" if column in ("module", "type") else "right")
    top = max((m["memory_bytes"] for m in modules), default=0)
    for index, m in enumerate(modules[:limit]):
        style = (
            "bold red" if index == 0 and top else ("yellow" if m["memory_bytes"] >= top / 2 and top else None)
        )
        table.add_row(
            escape(m["name"] or f"(root {m['type']})"),
            m["type"],
            f"{m['params']:,}",
            format_bytes(m["param_bytes"] + m["grad_bytes"] + m["optimizer_state_bytes"]),
            format_bytes(m["saved_bytes"]),
            format_bytes(m["output_bytes"]),
            _count(m["macs"]),
            style=style,
        )
    console.print(table)
    console.print(
        "[dim]MACs = multiply-adds; PyTorch's FlopCounterMode counts 2 FLOPs per MAC (JSON: flops, macs)[/]"
    )


def print_attention(console: Console, section: dict[str, Any] | None, batch_size: int) -> None:
    """The saved ``(.., L, L)`` tensors per module and in total ("attention scores (L²)"), and whether they
    are named as a lever (``explain --seq-len``)."""
    if section is None:
        return
    from autobatch.explain.pure.attention_lever import attention_line

    if section["layers"]:
        title = f"attention scores (L²) at {section['seq_len']} tokens, per module"
        table = Table(title=title, min_width=len(title))
        for column, justify in (("module", "left"), ("saved for bwd", "right")):
            table.add_column(column, justify=justify)  # type: ignore[arg-type]
        for layer in section["layers"]:
            table.add_row(escape(layer["name"]), format_bytes(layer["bytes"]))
        table.add_row("[bold]total[/]", f"[bold]{format_bytes(section['saved_bytes'])}[/]")
        console.print(table)
    style = "yellow" if section["dominates"] else "dim"
    console.print(f"[{style}]{escape(attention_line(section, batch_size))}[/]")


def print_levers(console: Console, levers: list[dict[str, Any]], batch_size: int, verified: bool) -> None:
    if not levers:
        return
    table = Table(title=f"levers, ranked by the maximum batch they would give (saving at batch {batch_size})")
    columns = ["lever", "saves", "max batch", "static", "per sample"] + (
        ["measured", "error"] if verified else []
    )
    for column in columns + ["note"]:
        table.add_column(column, justify="left" if column in ("lever", "note") else "right")
    for lever in levers:
        dim = not lever["applicable"]
        row = [
            escape(lever["name"]),
            format_bytes(lever["saving_bytes"]) if lever["saving_bytes"] is not None else "-",
            str(lever["predicted_max_batch_size"]) if lever["predicted_max_batch_size"] is not None else "-",
            format_bytes(lever["static_bytes"]) if lever["static_bytes"] is not None else "-",
            format_bytes(lever["bytes_per_sample"]) if lever["bytes_per_sample"] is not None else "-",
        ]
        if verified:
            row.append(str(lever["verified_max_batch_size"] or "-"))
            row.append(f"{lever['error']:+.1%}" if lever.get("error") is not None else "-")
        row.append(escape(lever["reason"] or lever["description"]))
        table.add_row(*row, style="dim" if dim else ("bold" if lever["kind"] == "now" else None))
    console.print(table)


def print_estimate(console: Console, result: Any, title: str) -> None:
    table = Table(title=title)
    for column in (
        "precision",
        "optimizer",
        "recompute",
        "max batch",
        "peak",
        "static",
        "per sample",
        "note",
    ):
        table.add_column(
            column, justify="left" if column in ("precision", "optimizer", "recompute", "note") else "right"
        )
    for c in result.combinations:
        static = sum(c.static_bytes.values()) if c.static_bytes else None
        table.add_row(
            c.precision,
            c.optimizer,
            c.ident.level,
            str(c.max_batch_size) if c.max_batch_size is not None else "-",
            format_bytes(c.peak_bytes),
            format_bytes(static),
            format_bytes(c.bytes_per_sample),
            escape(c.reason or ("" if c.status == "exact" else c.status)),
        )
    console.print(table)


def print_estimate_lengths(console: Console, result: Any) -> None:
    """``estimate --seq-len``: the estimated maximum per combination and length (a column per length), each
    combination's token budget and the ``L²`` share of its surface at the plan's length."""
    lengths = result.lengths
    if lengths is None:
        return
    columns = sorted({r.seq_len for r in lengths.maxima if r.seq_len})
    table = Table(title=f"estimated max batch per sequence length (plan at {lengths.plan_seq_len} tokens)")
    for name in ("precision", "optimizer", "recompute"):
        table.add_column(name)
    share_column = f"L² share at {lengths.plan_seq_len}"
    for column in [*map(str, columns), "token budget", share_column]:
        table.add_column(column, justify="right")
    for surface in lengths.surfaces:
        ident = ident_of(surface)
        rows = {r.seq_len: r for r in lengths.maxima if r.ident == ident}
        share = surface.get("attention_share")
        table.add_row(
            ident.precision,
            ident.optimizer,
            ident.level,
            *(_length_cell(rows.get(n)) for n in columns),
            f"{surface['token_budget']:,}" if surface.get("token_budget") else "-",
            f"{share:.0%}" if share is not None else "-",
        )
    console.print(table)
    console.print(
        "[dim]~: from the surface a + b·B·L + c·B·L² fitted over the estimated lines; token budget: the most "
        "tokens per micro-batch (B·L) within the budget at every length; L² share: of the activations per "
        "sample (c·L² of b·L + c·L²; needs two lengths)[/]"
    )


def _length_cell(row: Any) -> str:
    if row is None:
        return "-"
    if row.max_batch_size is None:
        return "skipped" if row.status == "skipped" else "none"
    return f"~{row.max_batch_size}" if row.status == "predicted" else str(row.max_batch_size)


def _count(n: int) -> str:
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return str(n)
