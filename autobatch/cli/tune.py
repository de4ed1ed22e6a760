"""``autobatch tune``: every combination's exact maximum, the chosen configuration, the plan."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..core.units import format_bytes
from ..errors import AutobatchError
from . import options as opt
from .app import app, console, stdout_write

if TYPE_CHECKING:
    from ..core.space import Combo
    from ..probe.protocol import ProbeOutcome
    from ..result import TuneResult
    from ..settings import Settings


@app.command(context_settings={"allow_interspersed_args": True})
def tune(
    script: Optional[str] = opt.SCRIPT,
    script_args: Optional[list[str]] = opt.SCRIPT_ARGS,
    config: Optional[Path] = opt.CONFIG,
    device: Optional[str] = opt.DEVICE,
    memory: Optional[str] = opt.MEMORY,
    headroom: Optional[float] = opt.HEADROOM,
    precision: Optional[list[str]] = opt.PRECISION,
    optimizer: Optional[list[str]] = opt.OPTIMIZER,
    recompute: Optional[bool] = opt.RECOMPUTE,
    recompute_class: Optional[list[str]] = opt.RECOMPUTE_CLASS,
    batch_multiple: Optional[int] = typer.Option(None, "--batch-multiple", help=opt._help("batch_multiple")),
    max_batch_size: Optional[int] = typer.Option(None, "--max-batch-size", help=opt._help("max_batch_size")),
    global_batch_size: Optional[int] = typer.Option(
        None, "--global-batch-size", "-g", help=opt._help("global_batch_size")
    ),
    world_size: Optional[int] = typer.Option(None, "--world-size", "-w", help=opt._help("world_size")),
    objective: Optional[str] = typer.Option(None, "--objective", help=opt._help("objective")),
    steps: Optional[int] = typer.Option(None, "--steps", help=opt._help("steps")),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help=opt._help("max_steps")),
    confirm_steps: Optional[int] = typer.Option(None, "--confirm-steps", help=opt._help("confirm_steps")),
    timeout: Optional[float] = opt.TIMEOUT,
    cache: Optional[bool] = typer.Option(None, "--cache/--no-cache", help=opt._help("cache")),
    exact_all: Optional[bool] = typer.Option(None, "--exact-all/--no-exact-all", help=opt._help("exact_all")),
    output: Optional[str] = typer.Option(None, "--output", help=opt._help("result")),
    emit: Optional[list[str]] = typer.Option(None, "--emit", "-e", help=opt._help("emit")),
    lightning_batch_key: Optional[str] = typer.Option(
        None, "--lightning-batch-key", help=opt._help("lightning_batch_key")
    ),
    deepspeed_base: Optional[str] = typer.Option(None, "--deepspeed-base", help=opt._help("deepspeed_base")),
    deepspeed_optimizer: Optional[bool] = typer.Option(
        None, "--deepspeed-optimizer", help=opt._help("deepspeed_optimizer")
    ),
    allow_cpu: Optional[bool] = typer.Option(None, "--allow-cpu", help=opt._help("allow_cpu")),
    hf: Optional[str] = opt.HF,
    hf_task: Optional[str] = opt.HF_TASK,
    seq_len: Optional[int] = opt.SEQ_LEN,
    lightning: Optional[str] = opt.LIGHTNING,
    datamodule: Optional[str] = opt.DATAMODULE,
    lightning_config: Optional[str] = opt.LIGHTNING_CONFIG,
    plot: Optional[Path] = typer.Option(
        None,
        "--plot",
        help="Draw memory against batch size (probes, fitted lines, budget, maxima) and the chosen "
        "combination's breakdown to FILE (.png or .svg; needs the plot extra).",
    ),
    as_json: bool = opt.JSON,
) -> None:
    """Search precision x optimizer x recomputation for the largest batch that fits; plan accumulation."""
    from ..session import spec_from_settings
    from ..settings import resolve_world_size

    settings = opt.load(locals())
    script_path = spec_from_settings(settings).label
    world, world_source = resolve_world_size(settings.plan.world_size, os.environ)
    if plot is not None:
        from ..explain.plot import check_plot_path

        check_plot_path(plot)  # before any probe
    console.print(f"[bold]autobatch tune[/] {escape(script_path)}: starting the probe server")
    result = run_tune(settings, world, world_source)
    print_table(result)
    print_chosen(result)
    console.print(f"result written to {settings.output.result}")
    if plot is not None:
        from ..explain.plot import plot_tune

        plot_tune(result, plot)
        console.print(f"plot written to {plot}")
    if settings.output.emit:
        _emit(result, settings)
    if as_json:
        stdout_write(json.dumps(result.to_dict(), indent=2))


def run_tune(settings: Settings, world: int, world_source: str) -> TuneResult:
    """Run the tune, saving the result after every probe; on failure or interruption, save and show
    what was measured, then re-raise."""
    from ..tuner import TuneOptions, Tuner

    result_path = Path(settings.output.result)
    session = opt.open_session(settings, on_probe=_progress)
    tuner = None
    try:
        info = session.start()
        console.print(
            f"device [bold]{info.name}[/]{' (auto)' if settings.device.device == 'auto' else ''}: capacity "
            f"{format_bytes(info.capacity_bytes)}, budget {format_bytes(info.budget_bytes)} "
            f"(headroom {info.headroom:.0%}); {escape(info.memory_definition)}"
        )
        if info.fell_back:
            from ..emit import refuse_fallback

            refuse_fallback(settings.output.emit, settings.output.allow_cpu)
            console.print(f"[yellow bold]warning[/]: {escape(info.notes[0])}")
        options = TuneOptions.from_settings(settings, world, world_source)
        tuner = Tuner(session, options, on_update=lambda r: _save(result_path, r))
        return tuner.run()
    except BaseException as exc:
        if tuner is not None:
            _keep_partial(tuner.result, exc, result_path)
        raise
    finally:
        session.close()


def _keep_partial(result: TuneResult, exc: BaseException, path: Path) -> None:
    result.status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
    if isinstance(exc, AutobatchError):
        result.notes.append(f"failed: {exc.message}")
    _save(path, result)
    if result.combinations and any(c.trace for c in result.combinations):
        print_table(result)
    console.print(f"partial result ({result.status}, {result.probes} probes) saved to {path}")


def _emit(result: TuneResult, settings: Settings) -> None:
    import shlex
    import sys

    from ..emit import emit as emit_files
    from ..emit import make_options, parse_emit_spec, report

    specs = [parse_emit_spec(spec) for spec in settings.output.emit]
    options = make_options(
        generated_by="autobatch " + shlex.join(sys.argv[1:]),
        lightning_batch_key=settings.output.lightning_batch_key,
        deepspeed_base=settings.output.deepspeed_base,
        deepspeed_optimizer=settings.output.deepspeed_optimizer,
        allow_cpu=settings.output.allow_cpu,
    )
    written = emit_files(result, specs, options)
    for line in report(result, [(fmt, path) for (fmt, _), path in zip(specs, written)], options):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def _save(path: Path, result: TuneResult) -> None:
    from ..files import write_atomic

    write_atomic(path, result.to_json() + "\n")


def _progress(combo: Combo, outcome: ProbeOutcome, cached: bool) -> None:
    style = {"fits": "green", "oom": "yellow"}.get(outcome.kind, "red")
    extra = f"peak {format_bytes(outcome.peak_bytes)}" if outcome.peak_bytes else ""
    if outcome.samples_per_second and outcome.kind == "fits":
        extra += f", {outcome.samples_per_second:,.0f} samples/s"
    if outcome.reason and outcome.kind != "fits":
        extra += f" ({outcome.reason})"
    console.print(
        f"  {combo.key:<38} batch {outcome.batch_size:>6} [{style}]{outcome.kind:<7}[/] {escape(extra)}"
        f" {'(cached)' if cached else f'{outcome.wall_seconds:.1f} s'}",
        highlight=False,
    )


def print_table(result: TuneResult) -> None:
    budget = result.device.get("budget_bytes") or 0
    table = Table(
        title=f"autobatch: {result.script} on {result.device.get('name')} (budget {format_bytes(budget)})"
    )
    for column in (
        "precision",
        "optimizer",
        "recompute",
        "max batch",
        "peak",
        "of budget",
        "samples/s",
        "probes",
        "note",
    ):
        table.add_column(
            column,
            justify="right"
            if column in ("max batch", "peak", "of budget", "samples/s", "probes")
            else "left",
        )
    for c in result.combinations:
        chosen = result.chosen is not None and (c.precision, c.optimizer, c.recompute) == (
            result.chosen.precision,
            result.chosen.optimizer,
            result.chosen.recompute,
        )
        note = c.reason or ("" if c.status in ("exact",) else c.status)
        table.add_row(
            c.precision,
            c.optimizer,
            "on" if c.recompute else "off",
            str(c.max_batch_size) if c.max_batch_size is not None else "-",
            format_bytes(c.peak_bytes) if c.peak_bytes else "-",
            f"{c.peak_bytes / budget:.0%}" if c.peak_bytes and budget else "-",
            f"{c.samples_per_second:,.1f}" if c.samples_per_second else "-",
            str(c.probes),
            escape(note or ""),
            style="bold" if chosen else None,
        )
    console.print(table)


def print_chosen(result: TuneResult) -> None:
    ch = result.chosen
    if ch is None:
        return
    console.print(
        f"[bold green]chosen[/] ({result.objective}): {ch.precision} / {ch.optimizer} / recompute "
        f"{'on' if ch.recompute else 'off'}: micro-batch {ch.micro_batch_size} x accumulation "
        f"{ch.accumulation_steps} x world {ch.world_size} = global {ch.global_batch_size}"
        + (f" (requested {ch.requested_global_batch_size})" if ch.requested_global_batch_size else "")
    )
    if ch.note:
        console.print(f"[yellow]note[/]: {escape(ch.note)}")
    for note in result.notes:
        console.print(f"[dim]- {escape(note)}[/]")
