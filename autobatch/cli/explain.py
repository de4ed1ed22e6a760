"""``autobatch explain``: where the peak memory of one batch size goes, and what each lever would buy.

One isolated, instrumented run at ``--batch-size`` (plus one at half of it for the per-sample slope),
under the same budget as ``tune`` and ``check``. Human output on stderr: a bar and a table of the
peak by category (adding up to the measured peak, the residual stated), the per-module table, and the
levers ranked by the maximum batch each would give. ``--json`` prints the report on stdout
(:mod:`autobatch.explain.parent.explainer` documents it). Exit status 0, also when the batch does not fit
(the report says so): explaining is the answer.

``--seq-len L`` (once) runs the batches at ``L`` tokens per sample (``make_batch(batch_size, L)``) and adds
the attention scores (``L²``) per module, and their lever when they dominate
(:mod:`autobatch.explain.pure.attention_lever`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from autobatch.cli import options as opt
from autobatch.cli.app import app, console, stdout_write
from autobatch.cli.progress import Output
from autobatch.core.units import format_bytes

if TYPE_CHECKING:
    from autobatch.devices.budget import DeviceInfo


@app.command(context_settings={"allow_interspersed_args": True})
def explain(
    batch_size: opt.BatchSize,
    script: opt.Script = None,
    script_args: opt.ScriptArgs = None,
    config: opt.Config = None,
    device: opt.Device = None,
    memory: opt.Memory = None,
    headroom: opt.Headroom = None,
    precision: opt.OnePrecision = None,
    optimizer: opt.OneOptimizer = None,
    one_recompute: opt.OneRecompute = False,
    recompute_class: opt.RecomputeClass = None,
    timeout: opt.Timeout = None,
    check_batch_size: opt.CheckBatchSize = None,
    seq_lens: opt.SeqLen = None,
    strategy: opt.Strategy = None,
    nproc_per_node: opt.NprocPerNode = None,
    vocab_trim: Annotated[
        float,
        typer.Option(
            "--vocab-trim",
            min=0.0,
            max=0.95,
            help="Fraction of the largest embedding's vocabulary the vocabulary lever removes (0 turns it off).",
        ),
    ] = 0.5,
    verify: Annotated[
        bool, typer.Option("--verify", help="Measure each lever's maximum batch with real probes (slower).")
    ] = False,
    plot: opt.Plot = None,
    as_json: opt.Json = False,
    verbose: opt.Verbose = False,
    quiet: opt.Quiet = False,
) -> None:
    """Break the peak memory of one batch size down (categories, modules) and rank the levers."""
    settings = opt.load(locals())
    script_path = settings.require_script()
    if plot is not None:
        from autobatch.explain.output.plot import check_plot_path

        check_plot_path(plot)

    from autobatch.service.check import combination
    from autobatch.service.explain import explain as run_explain

    devices: list[DeviceInfo] = []

    def show_status(
        text: str,
    ) -> None:  # the service's word that it starts (after refusing what it cannot run)
        console.print(f"[bold]autobatch explain[/] {escape(script_path)}: {escape(text)}")

    def show_device(info: DeviceInfo) -> None:
        devices.append(info)
        console.print(
            f"device [bold]{info.name}[/]: budget {format_bytes(info.budget_bytes)} "
            f"(capacity {format_bytes(info.capacity_bytes)}, headroom {info.headroom:.0%}); "
            f"{escape(info.memory_definition)}"
        )

    report = run_explain(
        settings,
        batch_size,
        Output().hooks(on_device=show_device, on_probe=None, on_status=show_status),
        recompute=one_recompute,
        vocab_trim=vocab_trim,
        verify=verify,
        progress=lambda text: console.print(f"[dim]  {escape(text)}[/]"),
    )
    combo, info = combination(settings, one_recompute), devices[0]
    data = report.to_dict()
    _print_report(report, data, combo.key, info.name, verify)
    if plot is not None:
        from autobatch.explain.output.plot import plot_explain

        plot_explain(data, plot)
        console.print(f"plot written to {plot}")
    if as_json:
        stdout_write(json.dumps(data, indent=2))


def _print_report(report: Any, data: dict[str, Any], key: str, device: str, verify: bool) -> None:
    from autobatch.explain.output.render import print_attention, print_breakdown, print_levers, print_modules

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
    print_attention(console, report.attention_scores, report.batch_size)
    if report.line:
        console.print(
            f"measured line: {format_bytes(report.line['static_bytes'])} static + "
            f"{format_bytes(report.line['bytes_per_sample'])} per sample "
            f"(batches {', '.join(str(m['batch_size']) for m in report.measured)})"
        )
    print_levers(console, report.levers, report.batch_size, verify)
    for note in report.notes:
        console.print(f"[dim]- {escape(note)}[/]")
