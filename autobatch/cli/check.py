"""``autobatch check``: one isolated probe at one batch size, under the same budget as ``tune``.

Exit status: 0 when the batch fits, 5 (``EXIT_OOM``) when it runs out of memory, 6 when the probe
crashed or timed out, 3 when the script raised its own error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.markup import escape

from ..core.units import format_bytes
from ..errors import EXIT_OOM, UsageError
from . import options as opt
from .app import app, console, stdout_write
from .progress import Output

if TYPE_CHECKING:
    from ..core.space import Combo
    from ..devices.budget import DeviceInfo
    from ..probe.protocol import ProbeOutcome


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
    as_json: bool = opt.JSON,
    verbose: bool = opt.VERBOSE,
    quiet: bool = opt.QUIET,
) -> None:
    """Run one isolated probe: does this batch fit? Peak memory and step time."""
    settings = opt.load(locals())
    settings.require_script()
    n_steps = n_steps or settings.probe.confirm_steps

    from ..core.space import Combo
    from ..probe.failures import raise_for

    combo = Combo(settings.search.precisions[0], settings.search.optimizers[0], one_recompute)
    out = Output()
    try:
        with opt.open_session(settings, cache=False, out=out) as session:
            info = session.device
            assert info is not None
            unsupported = info.unsupported(combo.precision)
            if unsupported:
                raise UsageError(unsupported, hint="pick another --precision")
            outcome = session.probe(combo, batch_size, min_steps=n_steps, max_steps=n_steps, strict=False)
    finally:
        out.close()
    raise_for(outcome, what=f"{combo.key} at batch {batch_size}")
    report = _report(combo, outcome, info)
    _print(report, combo, outcome, info, out)
    if as_json:
        stdout_write(json.dumps(report, indent=2))
    if not outcome.fits:
        raise typer.Exit(EXIT_OOM)


def _report(combo: Combo, outcome: ProbeOutcome, info: DeviceInfo) -> dict[str, Any]:
    """``check --json``."""
    fits = outcome.fits
    return {
        "fits": fits,
        "kind": outcome.kind,
        "batch_size": outcome.batch_size,
        "precision": combo.precision,
        "optimizer": combo.optimizer,
        "recompute": combo.recompute,
        "steps": outcome.steps,
        "peak_bytes": outcome.peak_bytes,  # distributed: the largest of rank_peak_bytes
        "strategy": info_strategy(outcome),
        "rank_peak_bytes": outcome.rank_peak_bytes,
        "failed_rank": outcome.failed_rank,
        "step_peaks": outcome.step_peaks,
        "budget_bytes": info.budget_bytes,
        "capacity_bytes": info.capacity_bytes,
        "device": info.name,
        "step_seconds": outcome.step_seconds,
        "samples_per_second": outcome.samples_per_second,
        "static_bytes": {
            "parameters": outcome.param_bytes,
            "gradients": outcome.grad_bytes,
            "optimizer_state": outcome.optimizer_state_bytes,
        },
        "reason": outcome.reason or (outcome.error_message if not fits else None),
        # fitted the cap, but closer to it than tune accepts (see autobatch.devices.budget)
        "within_margin": fits and info.too_close(outcome.peak_bytes),
        "device_stats": outcome.device_stats,
    }


def info_strategy(outcome: ProbeOutcome) -> dict[str, Any] | None:
    """A distributed probe's strategy, world size and fixed cost (start, rendezvous); None for one process."""
    return outcome.info.get("distributed")


def _print(
    report: dict[str, Any], combo: Combo, outcome: ProbeOutcome, info: DeviceInfo, out: Output
) -> None:
    fits = outcome.fits
    verdict = "fits" if fits else "out of memory"
    mean_step = sum(outcome.step_seconds) / len(outcome.step_seconds) if outcome.step_seconds else None
    out.summary(
        f"{combo.key} batch {outcome.batch_size} on {info.name}: {verdict} after {outcome.steps} step(s); peak "
        f"{format_bytes(outcome.peak_bytes)} of budget {format_bytes(info.budget_bytes)}"
        + (f"; {mean_step:.3f} s/step" if mean_step else "")
    )
    if outcome.rank_peak_bytes:
        console.print(
            "  per rank: "
            + ", ".join(f"rank {i} {format_bytes(p)}" for i, p in enumerate(outcome.rank_peak_bytes))
            + " (the table's peak is the worst rank)"
        )
    if not fits and report["reason"]:
        console.print(f"  {escape(str(report['reason']).splitlines()[0])}", style="dim")
    if report["within_margin"]:
        console.print(
            f"  [yellow]note[/]: the peak came within {format_bytes(info.margin_bytes)} of the budget; it fitted here, but "
            "tune does not pick a batch this close (a fresh process can exceed it)"
        )
