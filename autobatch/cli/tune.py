"""``autobatch tune``: every combination's exact maximum, the chosen configuration, the plan."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from autobatch.cli import options as opt
from autobatch.cli.app import app, console, stdout_write
from autobatch.cli.progress import Output
from autobatch.core.levels import SELECTIVE, fraction
from autobatch.core.space import block_labels, ident_of
from autobatch.core.units import format_bytes

if TYPE_CHECKING:
    from autobatch.devices.budget import DeviceInfo
    from autobatch.records.result import ComboResult, TuneResult
    from autobatch.settings import Settings


@app.command(context_settings={"allow_interspersed_args": True})
def tune(
    script: opt.Script = None,
    script_args: opt.ScriptArgs = None,
    config: opt.Config = None,
    device: opt.Device = None,
    memory: opt.Memory = None,
    headroom: opt.Headroom = None,
    precision: opt.Precisions = None,
    optimizer: opt.Optimizers = None,
    recompute: opt.Recompute = None,
    recompute_level: opt.RecomputeLevel = None,
    compile: opt.Compile = None,
    recompute_class: opt.RecomputeClass = None,
    batch_multiple: opt.BatchMultiple = None,
    max_batch_size: opt.MaxBatchSize = None,
    global_batch_size: opt.GlobalBatchSize = None,
    world_size: opt.WorldSize = None,
    strategy: opt.Strategy = None,
    nproc_per_node: opt.NprocPerNode = None,
    nnodes: opt.Nnodes = None,
    objective: opt.Objective = None,
    steps: opt.Steps = None,
    max_steps: opt.MaxSteps = None,
    confirm_steps: opt.ConfirmSteps = None,
    timeout: opt.Timeout = None,
    batch_env: opt.BatchEnv = None,
    seq_len_env: opt.SeqLenEnv = None,
    variant: opt.Variant = None,
    check_batch_size: opt.CheckBatchSize = None,
    cache: opt.Cache = None,
    refresh: opt.Refresh = False,
    lock_timeout: opt.LockTimeout = None,
    exact_all: opt.ExactAll = None,
    strict: opt.Strict = None,
    output: opt.Output = None,
    emit: opt.Emit = None,
    lightning_batch_key: opt.LightningBatchKey = None,
    deepspeed_base: opt.DeepspeedBase = None,
    deepspeed_optimizer: opt.DeepspeedOptimizer = None,
    allow_cpu: opt.AllowCpu = None,
    hf: opt.Hf = None,
    hf_task: opt.HfTask = None,
    seq_lens: opt.SeqLen = None,
    seq_len: opt.PlanSeqLen = None,
    lightning: opt.Lightning = None,
    datamodule: opt.Datamodule = None,
    lightning_config: opt.LightningConfig = None,
    plot: opt.Plot = None,
    as_json: opt.Json = False,
    verbose: opt.Verbose = False,
    quiet: opt.Quiet = False,
) -> None:
    """Search precision x optimizer x recomputation for the largest batch that fits; plan accumulation."""
    from autobatch.records.result import limited_failure
    from autobatch.service.tune import tune as run_tune
    from autobatch.step.spec import spec_from_settings

    settings = opt.load(locals())
    if plot is not None:
        from autobatch.explain.output.plot import check_plot_path

        check_plot_path(plot)  # before any probe
    out = Output(as_json=as_json)
    out.status(f"autobatch tune {spec_from_settings(settings).label}")
    try:
        result = run_tune(
            settings,
            out.hooks(
                on_device=_device_line(settings, out), on_result=_answer(out), on_partial=_partial(out)
            ),
            result_file=settings.output.result,
            refresh=refresh,
            generated_by="autobatch " + shlex.join(sys.argv[1:]),
        )
    finally:
        out.close()
    if plot is not None:
        from autobatch.explain.output.plot import plot_tune

        plot_tune(result, plot)
        out.status(f"plot written to {plot}")
    out.summary(summary_line(result, settings.output.result))
    if as_json:
        stdout_write(json.dumps(result.to_dict(), indent=2))
    failure = limited_failure(result)
    if failure is not None:
        raise failure


def _device_line(settings: Settings, out: Output) -> Callable[[DeviceInfo], None]:
    def device(info: DeviceInfo) -> None:
        if info.fell_back:
            out.warning(info.notes[0])
        auto = " (auto)" if settings.device.device == "auto" else ""
        out.status(
            f"device {info.name}{auto}: capacity {format_bytes(info.capacity_bytes)}, budget "
            f"{format_bytes(info.budget_bytes)} (headroom {info.headroom:.0%}); {info.memory_definition}"
        )

    return device


def _answer(out: Output) -> Callable[[TuneResult], None]:
    def show(result: TuneResult) -> None:
        out.close()  # the live line of the last probe
        if not out.quiet:
            print_table(result)
            print_lengths(result)
            print_chosen(result)

    return show


def _partial(out: Output) -> Callable[[TuneResult, str], None]:
    def show(result: TuneResult, where: str) -> None:
        if not out.quiet and result.combinations and any(c.trace for c in result.combinations):
            print_table(result)
        # a tune that ended with nothing chosen (nothing fits: exit 4) kept a whole result, not a partial one
        what = "result (nothing chosen" if result.status == "complete" else f"partial result ({result.status}"
        out.status(f"{what}, {_probes_in_words(result)}) {where}")

    return show


def _probes_in_words(result: TuneResult) -> str:
    """The probes this run measured, and those it replayed from the journal (a re-run after an interruption):
    "1 probe and 2 from the journal", where the count alone said "1 probes" of a trace of three."""
    replayed = sum(1 for combo in result.combinations for probe in combo.trace if probe.cached)
    measured = f"{result.probes} probe{'' if result.probes == 1 else 's'}"
    return f"{measured} and {replayed} from the journal" if replayed else measured


def summary_line(result: TuneResult, path: str) -> str:
    """The one line ``--quiet`` keeps: the choice and the plan, where the result went, what it cost."""
    ch = result.chosen
    how = (
        "served from the cache"
        if (result.cache or {}).get("served")
        else f"{result.probes} probes, {result.wall_seconds or 0:.1f} s"
    )
    if ch is None:
        return f"autobatch: no combination chosen ({how}); result in {path}"
    return f"autobatch: {ch.ident.name} {ch.plan_words} ({how}); result in {path}"


def _max_cell(c: ComboResult) -> str:
    """A combination's maximum in the table: a pruned one's is a lower bound (the largest batch known to fit)."""
    if c.max_batch_size is None:
        return "-"
    return f"≥{c.max_batch_size}" if c.status == "pruned" else str(c.max_batch_size)


def _note(c: ComboResult) -> str:
    """A combination's note: what its level wraps, its compile time, why it stopped short of exact."""
    note = c.reason or ("" if c.status in ("exact",) else c.status)
    if c.compile_seconds:
        note = f"compiled in {c.compile_seconds:.1f} s, apart from the step time" + (
            f"; {note}" if note else ""
        )
    if c.recompute and c.recompute_blocks:  # what the level wrapped
        wrapped = ", ".join(block_labels(c.recompute_blocks, c.recompute_blocks))
        part = fraction(c.ident.level)
        how = f"the first {part[0]} of {wrapped}" if part else wrapped
        how += " (matmul and attention outputs kept)" if c.ident.level == SELECTIVE else ""
        note = f"recomputes {how}" + (f"; {note}" if note else "")
    return note


def print_table(result: TuneResult) -> None:
    budget = result.device.get("budget_bytes") or 0
    dist = result.distributed
    ranks = f", {dist['strategy']} on {dist['nproc_per_node']} ranks, per rank" if dist else ""
    table = Table(
        title=f"autobatch: {result.script} on {result.device.get('name')}{ranks} (budget {format_bytes(budget)})"
    )
    peak = "peak (worst rank)" if dist else "peak"
    planned = result.chosen is not None and result.chosen.requested_global_batch_size is not None
    timed = any(c.global_batch_seconds for c in result.combinations)
    columns = ["precision", "optimizer", "recompute", "max batch", peak, "of budget", "samples/s"]
    columns += (["plan"] if planned else []) + (["s / global batch"] if timed else []) + ["probes", "note"]
    for column in columns:
        table.add_column(
            column, justify="left" if column in ("precision", "optimizer", "recompute", "note") else "right"
        )
    for c in result.combinations:
        chosen = result.chosen is not None and c.ident == result.chosen.ident
        cells = [
            c.precision,
            c.optimizer,
            c.ident.level + (" +compile" if c.compile else ""),
            _max_cell(c),
            format_bytes(c.peak_bytes) if c.peak_bytes else "-",
            f"{c.peak_bytes / budget:.0%}" if c.peak_bytes and budget else "-",
            f"{c.samples_per_second:,.1f}" if c.samples_per_second else "-",
        ]
        cells += [f"{c.plan[0]} x {c.plan[1]}" if c.plan else "-"] if planned else []
        cells += [f"{c.global_batch_seconds:.3f}" if c.global_batch_seconds else "-"] if timed else []
        cells += [str(c.probes), escape(_note(c))]
        table.add_row(*cells, style="bold" if chosen else None)
    console.print(table)  # in a log (not a terminal) no cell is wrapped: the table is as wide as its content


def print_lengths(result: TuneResult) -> None:
    """The maxima per combination and sequence length, each combination's token budget and surface."""
    lengths = result.lengths
    if lengths is None or len({r.seq_len for r in lengths.maxima}) < 2:
        return
    columns = sorted({r.seq_len for r in lengths.maxima if r.seq_len})
    table = Table(title=f"max batch per sequence length (plan at {lengths.plan_seq_len} tokens; probes)")
    for name in ("precision", "optimizer", "recompute"):
        table.add_column(name)
    for column in [*map(str, columns), "token budget", "L² share", "fit error"]:
        table.add_column(column, justify="right")
    for surface in lengths.surfaces:
        ident = ident_of(surface)
        rows = {r.seq_len: r for r in lengths.maxima if r.ident == ident}
        error, share = surface.get("fit_error"), surface.get("attention_share")
        table.add_row(
            ident.precision,
            ident.optimizer,
            ident.level + (" +compile" if ident.compile else ""),
            *(_length_cell(rows.get(n)) for n in columns),
            f"{surface['token_budget']:,}" if surface.get("token_budget") else "-",
            f"{share:.0%}" if share is not None else "-",
            f"{error:.1%}" if error is not None else "-",
        )
    console.print(table)
    console.print(
        "~: predicted from the surface a + b·B·L + c·B·L², never measured; token budget: the most tokens per "
        "micro-batch (B·L) that fit at every searched length; L² share: of the activations at the plan's length",
        style="dim",
    )


def _length_cell(row: ComboResult | None) -> str:
    if row is None or row.max_batch_size is None:
        return "-" if row is None else row.status
    if row.status == "predicted":
        return f"~{row.max_batch_size}"
    return f"{_max_cell(row)} ({row.probes})"


def print_chosen(result: TuneResult) -> None:
    from autobatch.emit.args import caveats as args_caveats
    from autobatch.emit.args import command_text
    from autobatch.emit.common import make_options

    ch = result.chosen
    if ch is None:
        return
    console.print(
        f"[bold green]chosen[/] ({result.objective}): {ch.precision} / {ch.optimizer} / recompute "
        f"{ {'full': 'on'}.get(ch.ident.level, ch.ident.level) }{' / torch.compile' if ch.compile else ''}: "
        f"{ch.plan_words}"
        + (f" (requested {ch.requested_global_batch_size})" if ch.requested_global_batch_size else "")
        + (f", at {ch.seq_len} tokens per sample" if ch.seq_len else ""),
    )
    if ch.decided_by:
        console.print(f"decided by: {escape(ch.decided_by)}")
    command = command_text(result)  # a script tuned as it is: the job's command line, the plan filled in
    if command is not None:
        console.print(f"[bold]command[/]: {escape(command)}", soft_wrap=True)
        for caveat in args_caveats(result, make_options("")):
            console.print(f"[yellow]note[/]: {escape(caveat)}")
    elif ch.environment:  # no command line to carry it: the job must set it (the env format exports it)
        words = " ".join(f"{name}={value}" for name, value in ch.environment.items())
        console.print(f"[bold]environment[/]: {escape(words)} (the job runs under it, as the probes did)")
    if ch.note:
        console.print(f"[yellow]note[/]: {escape(ch.note)}")
    for note in result.notes:
        console.print(f"[dim]- {escape(note)}[/]")
