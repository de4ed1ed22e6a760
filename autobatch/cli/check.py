"""``autobatch check``: one isolated probe at one batch size, under the same budget as ``tune``.

Exit status: 0 when the batch fits, 5 (``EXIT_OOM``) when it runs out of memory, 6 when the probe
crashed or timed out, 3 when the script raised its own error.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

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
    script: Optional[str] = opt.SCRIPT,
    script_args: Optional[list[str]] = opt.SCRIPT_ARGS,
    batch_size: int = typer.Option(..., "--batch-size", "-b", min=1, help="The batch size to try."),
    n_steps: Optional[int] = typer.Option(
        None, "--steps", min=1, help="Full training steps to run (default: the confirm_steps setting)."
    ),
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
    hf: Optional[str] = opt.HF,
    hf_task: Optional[str] = opt.HF_TASK,
    seq_len: Optional[int] = opt.SEQ_LEN,
    lightning: Optional[str] = opt.LIGHTNING,
    datamodule: Optional[str] = opt.DATAMODULE,
    lightning_config: Optional[str] = opt.LIGHTNING_CONFIG,
    as_json: bool = opt.JSON,
    verbose: bool = opt.VERBOSE,
    quiet: bool = opt.QUIET,
) -> None:
    """Run one isolated probe: does this batch fit? Peak memory and step time."""
    settings = opt.load(locals())
    n_steps = n_steps or settings.probe.confirm_steps

    from autobatch.core.space import Combo
    from autobatch.run.check import check_batch

    combo = Combo(settings.search.precisions[0], settings.search.optimizers[0], one_recompute)
    out = Output()
    try:
        with opt.open_session(settings, cache=False, out=out) as session:
            report = check_batch(session, combo, batch_size, n_steps)
            info = session.device
    finally:
        out.close()
    assert info is not None
    _print(report, combo, info, out)
    if as_json:
        stdout_write(report.to_json())
    if not report.fits:
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
