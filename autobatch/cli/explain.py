"""``autobatch explain``: where the peak memory of one batch size goes, and what each lever would buy.

One isolated, instrumented run at ``--batch-size`` (plus one at half of it for the per-sample slope),
under the same budget as ``tune`` and ``check``. Human output on stderr: a bar and a table of the
peak by category (adding up to the measured peak, the residual stated), the per-module table, and the
levers ranked by the maximum batch each would give. ``--json`` prints the report on stdout
(:mod:`autobatch.explain.parent.explainer` documents it). Exit status 0, also when the batch does not fit
(the report says so): explaining is the answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from autobatch.cli import options as opt
from autobatch.cli.app import app, console, stdout_write
from autobatch.core.units import format_bytes
from autobatch.errors import UsageError


@app.command(context_settings={"allow_interspersed_args": True})
def explain(
    script: Optional[str] = opt.SCRIPT,
    script_args: Optional[list[str]] = opt.SCRIPT_ARGS,
    batch_size: int = typer.Option(..., "--batch-size", "-b", min=1, help="The batch size to explain."),
    config: Optional[Path] = opt.CONFIG,
    device: Optional[str] = opt.DEVICE,
    memory: Optional[str] = opt.MEMORY,
    headroom: Optional[float] = opt.HEADROOM,
    precision: Optional[str] = opt.ONE_PRECISION,
    optimizer: Optional[str] = opt.ONE_OPTIMIZER,
    one_recompute: bool = opt.ONE_RECOMPUTE,
    recompute_class: Optional[list[str]] = opt.RECOMPUTE_CLASS,
    timeout: Optional[float] = opt.TIMEOUT,
    check_batch_size: Optional[bool] = opt.CHECK_BATCH_SIZE,
    strategy: Optional[str] = opt.STRATEGY,
    nproc_per_node: Optional[int] = opt.NPROC_PER_NODE,
    vocab_trim: float = typer.Option(
        0.5,
        "--vocab-trim",
        min=0.0,
        max=0.95,
        help="Fraction of the largest embedding's vocabulary the "
        "vocabulary lever removes (0 turns the lever off).",
    ),
    verify: bool = typer.Option(
        False, "--verify", help="Measure each lever's maximum batch with real probes (slower)."
    ),
    plot: Optional[Path] = typer.Option(
        None, "--plot", help="Draw memory against batch size and the breakdown to FILE (.png or .svg)."
    ),
    as_json: bool = opt.JSON,
    verbose: bool = opt.VERBOSE,
    quiet: bool = opt.QUIET,
) -> None:
    """Break the peak memory of one batch size down (categories, modules) and rank the levers."""
    settings = opt.load(locals())
    script_path = settings.require_script()
    if plot is not None:
        from autobatch.explain.output.plot import check_plot_path

        check_plot_path(plot)

    from autobatch.core.space import Combo
    from autobatch.explain.parent.explainer import explain_batch
    from autobatch.explain.pure.options import OP_MODULES

    combo = Combo(settings.search.precisions[0], settings.search.optimizers[0], one_recompute)
    limits = settings.limits()
    console.print(f"[bold]autobatch explain[/] {escape(script_path)}: starting the probe server")
    with opt.open_session(settings, op_modules=OP_MODULES) as session:
        info = session.device
        assert info is not None
        console.print(
            f"device [bold]{info.name}[/]: budget {format_bytes(info.budget_bytes)} "
            f"(capacity {format_bytes(info.capacity_bytes)}, headroom {info.headroom:.0%}); "
            f"{escape(info.memory_definition)}"
        )
        unsupported = info.unsupported(combo.precision)
        if unsupported:
            raise UsageError(unsupported, hint="pick another --precision")
        report = explain_batch(
            session,
            combo,
            batch_size,
            limits,
            vocab_trim=vocab_trim,
            verify=verify,
            progress=lambda text: console.print(f"[dim]  {escape(text)}[/]"),
        )
    data = report.to_dict()
    _print_report(report, data, combo.key, info.name, verify)
    if plot is not None:
        from autobatch.explain.output.plot import plot_explain

        plot_explain(data, plot)
        console.print(f"plot written to {plot}")
    if as_json:
        stdout_write(json.dumps(data, indent=2))


def _print_report(report: Any, data: dict[str, Any], key: str, device: str, verify: bool) -> None:
    from autobatch.explain.output.render import print_breakdown, print_levers, print_modules

    verdict = "[green]fits[/]" if report.fits else f"[yellow]does not fit[/] ({report.kind})"
    console.print(
        f"{key} batch {report.batch_size} on {device}: {verdict}; measured peak "
        f"{format_bytes(report.peak_bytes)} of budget {format_bytes(report.budget_bytes)}"
    )
    if report.distributed:
        from autobatch.explain.pure.per_rank import rank_peaks_line

        dist = report.distributed
        peaks = [{"rank": r, "peak_bytes": p} for r, p in enumerate(dist["rank_peak_bytes"])]
        console.print(
            f"{dist['strategy']} on {dist['nproc_per_node']} ranks, per-rank peaks: "
            f"{rank_peaks_line(peaks, dist['shown_rank'], format_bytes)}; the breakdown is rank {dist['shown_rank']}'s"
        )
    print_breakdown(console, data)
    print_modules(console, report.modules)
    if report.line:
        console.print(
            f"measured line: {format_bytes(report.line['static_bytes'])} static + "
            f"{format_bytes(report.line['bytes_per_sample'])} per sample "
            f"(batches {', '.join(str(m['batch_size']) for m in report.measured)})"
        )
    print_levers(console, report.levers, report.batch_size, verify)
    for note in report.notes:
        console.print(f"[dim]- {escape(note)}[/]")
