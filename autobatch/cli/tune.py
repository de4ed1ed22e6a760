"""``autobatch tune``: every combination's exact maximum, the chosen configuration, the plan."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import typer
from rich.markup import escape
from rich.table import Table

from autobatch.cli import options as opt
from autobatch.cli.app import app, console, stdout_write
from autobatch.cli.progress import Output, unwrapped_console
from autobatch.cli.saving import ResultSaver, preflight
from autobatch.core.units import format_bytes
from autobatch.errors import AutobatchError, UsageError

if TYPE_CHECKING:
    from autobatch.devices.budget import DeviceInfo
    from autobatch.records.result import ComboResult, TuneResult
    from autobatch.run.calibrate import Hooks
    from autobatch.settings import Settings


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
    strategy: Optional[str] = opt.STRATEGY,
    nproc_per_node: Optional[int] = opt.NPROC_PER_NODE,
    nnodes: Optional[int] = opt.NNODES,
    objective: Optional[str] = typer.Option(None, "--objective", help=opt._help("objective")),
    steps: Optional[int] = typer.Option(None, "--steps", help=opt._help("steps")),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help=opt._help("max_steps")),
    confirm_steps: Optional[int] = typer.Option(None, "--confirm-steps", help=opt._help("confirm_steps")),
    timeout: Optional[float] = opt.TIMEOUT,
    check_batch_size: Optional[bool] = opt.CHECK_BATCH_SIZE,
    cache: Optional[bool] = typer.Option(None, "--cache/--no-cache", help=opt._help("cache")),
    refresh: bool = typer.Option(
        False,
        "--refresh",
        help="Ignore the cache: measure every probe again (the new result replaces the stored one).",
    ),
    lock_timeout: Optional[float] = typer.Option(None, "--lock-timeout", help=opt._help("lock_timeout")),
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
    verbose: bool = opt.VERBOSE,
    quiet: bool = opt.QUIET,
) -> None:
    """Search precision x optimizer x recomputation for the largest batch that fits; plan accumulation."""
    from autobatch.records.result import limited_failure
    from autobatch.run.session import spec_from_settings

    settings = opt.load(locals())
    script_path = spec_from_settings(settings).label
    world, world_source = _world(settings)
    if plot is not None:
        from autobatch.explain.output.plot import check_plot_path

        check_plot_path(plot)  # before any probe
    saver = ResultSaver(Path(settings.output.result))
    preflight(saver.path)  # before any probe
    out = Output()
    out.status(f"autobatch tune {script_path}")
    result = run_tune(settings, world, world_source, refresh=refresh, out=out, saver=saver)
    if not out.quiet:
        print_table(result)
        print_chosen(result)  # before the file: a full disk must not hide the answer
    saver.finish(result)
    out.status(f"result written to {settings.output.result}")
    if plot is not None:
        from autobatch.explain.output.plot import plot_tune

        plot_tune(result, plot)
        out.status(f"plot written to {plot}")
    if settings.output.emit:
        _emit(result, settings, out)
    out.summary(summary_line(result, settings.output.result))
    if as_json:
        stdout_write(json.dumps(result.to_dict(), indent=2))
    failure = limited_failure(result)
    if failure is not None:
        raise failure


def _world(settings: Settings) -> tuple[int, str]:
    """The world size (a strategy implies one) and where it came from; every process needs at least one
    micro-batch (of ``batch_multiple`` samples) of the global batch per step."""
    from autobatch.core.world import strategy_world
    from autobatch.settings import resolve_world_size

    world, source = resolve_world_size(settings.plan.world_size, os.environ)
    dist = settings.distributed
    implied = strategy_world(dist.strategy, dist.nproc_per_node, dist.nnodes, os.environ)
    if implied is not None and settings.plan.world_size is None:
        world, source = implied
    global_batch, multiple = settings.plan.global_batch_size, settings.search.batch_multiple
    if global_batch is not None and global_batch < world * multiple:
        raise UsageError(
            f"--global-batch-size {global_batch} is smaller than the world size {world} (from {source}) x "
            f"batch multiple {multiple}: every process needs at least {multiple} sample(s) per step",
            hint=f"raise --global-batch-size to a multiple of {world * multiple}, or lower --world-size",
        )
    return world, source


def run_tune(
    settings: Settings,
    world: int,
    world_source: str,
    *,
    refresh: bool = False,
    out: Output | None = None,
    saver: ResultSaver | None = None,
) -> TuneResult:
    """Run the tune (:func:`autobatch.run.calibrate.calibrate`), saving the result after every probe; on
    failure or interruption, save and show what was measured, then re-raise."""
    from autobatch.run.calibrate import calibrate

    out = out or Output()
    save = saver or ResultSaver(Path(settings.output.result))
    latest: list[TuneResult] = []

    def keep(result: TuneResult) -> None:
        latest[:1] = [result]

    def update(result: TuneResult) -> None:
        keep(result)
        save(result)

    hooks = replace(_hooks(settings, out, update), on_start=keep)
    try:
        result = calibrate(settings, world, world_source, refresh=refresh, hooks=hooks)
        save(result)
        return result
    except BaseException as exc:
        if latest:
            _keep_partial(latest[0], exc, save, out)
        raise
    finally:
        out.close()


def _hooks(settings: Settings, out: Output, update: Callable[[TuneResult], None]) -> Hooks:
    from autobatch.cli.state import STATE
    from autobatch.run.calibrate import Hooks

    def device(info: DeviceInfo) -> None:
        if info.fell_back:
            from autobatch.emit import refuse_fallback

            refuse_fallback(settings.output.emit, settings.output.allow_cpu)
            out.warning(info.notes[0])
        auto = " (auto)" if settings.device.device == "auto" else ""
        out.status(
            f"device {info.name}{auto}: capacity {format_bytes(info.capacity_bytes)}, budget "
            f"{format_bytes(info.budget_bytes)} (headroom {info.headroom:.0%}); {info.memory_definition}"
        )

    return Hooks(
        on_probe=out.probe,
        on_update=update,
        on_status=out.status,
        on_device=device,
        on_warning=out.warning,
        on_wait=out.wait,
        wrap_runner=out.watch,
        runner_factory=STATE.runner_factory,
    )


def summary_line(result: TuneResult, path: str) -> str:
    """The one line ``--quiet`` keeps: the choice and the plan, where the result went, what it cost."""
    ch = result.chosen
    how = (
        "served from the cache"
        if result.cache
        else f"{result.probes} probes, {result.wall_seconds or 0:.1f} s"
    )
    if ch is None:
        return f"autobatch: no combination chosen ({how}); result in {path}"
    return (
        f"autobatch: {ch.precision}/{ch.optimizer}/{'recompute' if ch.recompute else 'no-recompute'} "
        f"micro-batch {ch.micro_batch_size} x accumulation {ch.accumulation_steps} x world {ch.world_size} = "
        f"global {ch.global_batch_size} ({how}); result in {path}"
    )


def _keep_partial(result: TuneResult, exc: BaseException, save: ResultSaver, out: Output) -> None:
    result.status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
    if isinstance(exc, AutobatchError):
        result.notes.append(f"failed: {exc.message}")
    save(result)
    if not out.quiet and result.combinations and any(c.trace for c in result.combinations):
        print_table(result)
    where = "not saved (see the warning above)" if save.error else f"saved to {save.path}"
    out.status(f"partial result ({result.status}, {result.probes} probes) {where}")


def _emit(result: TuneResult, settings: Settings, out: Output) -> None:
    import shlex
    import sys

    from autobatch.emit import emit as emit_files
    from autobatch.emit import make_options, parse_emit_spec, report

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
        out.status(line)


def _max_cell(c: ComboResult) -> str:
    """A combination's maximum in the table: a pruned one's is a lower bound (the largest batch known to fit)."""
    if c.max_batch_size is None:
        return "-"
    return f"≥{c.max_batch_size}" if c.status == "pruned" else str(c.max_batch_size)


def print_table(result: TuneResult) -> None:
    budget = result.device.get("budget_bytes") or 0
    dist = result.distributed
    ranks = f", {dist['strategy']} on {dist['nproc_per_node']} ranks, per rank" if dist else ""
    table = Table(
        title=f"autobatch: {result.script} on {result.device.get('name')}{ranks} (budget {format_bytes(budget)})"
    )
    peak = "peak (worst rank)" if dist else "peak"
    for column in (
        "precision",
        "optimizer",
        "recompute",
        "max batch",
        peak,
        "of budget",
        "samples/s",
        "probes",
        "note",
    ):
        table.add_column(
            column,
            justify="right" if column in ("max batch", peak, "of budget", "samples/s", "probes") else "left",
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
            _max_cell(c),
            format_bytes(c.peak_bytes) if c.peak_bytes else "-",
            f"{c.peak_bytes / budget:.0%}" if c.peak_bytes and budget else "-",
            f"{c.samples_per_second:,.1f}" if c.samples_per_second else "-",
            str(c.probes),
            escape(note or ""),
            style="bold" if chosen else None,
        )
    # In a log (not a terminal) no cell is wrapped: the table is as wide as its content.
    (console if console.is_terminal else unwrapped_console()).print(table)


def print_chosen(result: TuneResult) -> None:
    ch = result.chosen
    if ch is None:
        return
    unwrapped = not console.is_terminal  # a log: one line each, however long
    console.print(
        f"[bold green]chosen[/] ({result.objective}): {ch.precision} / {ch.optimizer} / recompute "
        f"{'on' if ch.recompute else 'off'}: micro-batch {ch.micro_batch_size} x accumulation "
        f"{ch.accumulation_steps} x world {ch.world_size} = global {ch.global_batch_size}"
        + (f" (requested {ch.requested_global_batch_size})" if ch.requested_global_batch_size else ""),
        soft_wrap=unwrapped,
    )
    if ch.decided_by:
        console.print(f"decided by: {escape(ch.decided_by)}", soft_wrap=unwrapped)
    if ch.note:
        console.print(f"[yellow]note[/]: {escape(ch.note)}", soft_wrap=unwrapped)
    for note in result.notes:
        console.print(f"[dim]- {escape(note)}[/]", soft_wrap=unwrapped)
