"""``autobatch check``: one isolated probe at one batch size, under the same budget as ``tune``.

``-b`` given more than once probes each batch size in the order given, in one command (one start of the
probe server, one inspection of the model): ``-b 40 -b 41`` asks whether a tune's answer fits and the next
batch does not, for one start instead of two. A summary line per batch; ``--json`` writes the one
report as an object, several as an array of them once every probe has answered.

Exit status: 0 when every batch fits, 5 (``EXIT_OOM``) when one runs out of memory, 6 when a probe
crashed or timed out, 3 when the script raised its own error.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape

from autobatch.cli import options as opt
from autobatch.cli.app import app, console, stdout_write
from autobatch.cli.progress import Output
from autobatch.core.units import format_bytes
from autobatch.errors import EXIT_OOM

if TYPE_CHECKING:
    from autobatch.core.space import Combo
    from autobatch.devices.budget import DeviceInfo
    from autobatch.records.check import CheckResult


@app.command(context_settings={"allow_interspersed_args": True})
def check(
    batch_sizes: Annotated[
        list[int],
        typer.Option(
            "--batch-size", "-b", min=1, help="The batch size to run; give it again to run several, in order."
        ),
    ],
    script: opt.Script = None,
    script_args: opt.ScriptArgs = None,
    n_steps: Annotated[
        Optional[int],
        typer.Option(
            "--steps", min=1, help="Full training steps to run (default: the confirm_steps setting)."
        ),
    ] = None,
    config: opt.Config = None,
    device: opt.Device = None,
    memory: opt.Memory = None,
    headroom: opt.Headroom = None,
    precision: opt.OnePrecision = None,
    optimizer: opt.OneOptimizer = None,
    one_recompute: opt.OneRecompute = False,
    one_level: opt.OneLevel = None,
    one_compile: opt.OneCompile = False,
    recompute_class: opt.RecomputeClass = None,
    timeout: opt.Timeout = None,
    cache: opt.Cache = None,
    batch_env: opt.BatchEnv = None,
    seq_len_env: opt.SeqLenEnv = None,
    check_batch_size: opt.CheckBatchSize = None,
    strategy: opt.Strategy = None,
    nproc_per_node: opt.NprocPerNode = None,
    hf: opt.Hf = None,
    hf_task: opt.HfTask = None,
    seq_lens: opt.SeqLen = None,
    lightning: opt.Lightning = None,
    datamodule: opt.Datamodule = None,
    lightning_config: opt.LightningConfig = None,
    as_json: opt.Json = False,
    verbose: opt.Verbose = False,
    quiet: opt.Quiet = False,
) -> None:
    """Run isolated probes: does this batch fit? Peak memory and step time."""
    from autobatch.service.check import checks

    settings = opt.load(locals())
    out = Output(as_json=as_json)
    devices: list[DeviceInfo] = []
    reports: list[CheckResult] = []
    try:
        for report in checks(
            settings,
            batch_sizes,
            out.hooks(on_device=devices.append),
            recompute=one_level or one_recompute,
            compile=one_compile,
            steps=n_steps,
        ):
            reports.append(report)
            _print(report, report.combo, devices[0], out)
    finally:
        out.close()
    if as_json:
        one = len(reports) == 1
        stdout_write(reports[0].to_json() if one else json.dumps([r.to_dict() for r in reports], indent=2))
    if not all(report.fits for report in reports):
        raise typer.Exit(EXIT_OOM)


def _print(report: CheckResult, combo: Combo, info: DeviceInfo, out: Output) -> None:
    fits = report.fits
    if info.fell_back:
        out.warning(info.notes[0])
    verdict = "fits" if fits else "out of memory"
    mean_step = sum(report.step_seconds) / len(report.step_seconds) if report.step_seconds else None
    out.summary(
        f"{combo.key} batch {report.batch_size} on {info.name}: {verdict} after {report.steps} step(s); peak "
        f"{format_bytes(report.peak_bytes)} of budget {format_bytes(info.budget_bytes)}"
        + (f"; {mean_step:.3f} s/step" if mean_step else "")
    )
    if report.rank_peak_bytes:
        console.print(
            "  per rank: "
            + ", ".join(f"rank {i} {format_bytes(p)}" for i, p in enumerate(report.rank_peak_bytes))
            + " (the table's peak is the worst rank)"
        )
    if not fits and report.reason:
        console.print(f"  {escape(report.reason.splitlines()[0])}", style="dim")
    if report.within_margin:
        console.print(
            f"  [yellow]note[/]: the peak came within {format_bytes(info.margin_bytes)} of the budget; it fitted here, but "
            "tune does not pick a batch this close (a fresh process can exceed it)"
        )
