"""``autobatch estimate``: each combination's maximum batch for a card you do not have, with no real allocation.

The step runs under fake tensors on the CPU (:mod:`autobatch.explain.worker.simulate`), an allocator model
turns its tensors into the target's memory, and ``tune``'s search finds the largest batch within the budget;
with ``--seq-len`` at each length (:mod:`autobatch.explain.parent.estimate_lengths`). The targets, the report
and what differs on a real device: docs/explain-estimate.md.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import typer
from rich.markup import escape

from autobatch.cli import options as opt
from autobatch.cli.app import app, console, stdout_write
from autobatch.core.units import format_bytes
from autobatch.errors import ProbeFailure
from autobatch.step.scriptpath import check_script_path

CAVEATS_CUDA = (
    "estimate, not a measurement: the step ran under fake tensors with PyTorch's CPU kernels. On a real GPU, "
    "kernel choices differ (scaled_dot_product_attention may pick flash or memory-efficient backends that save "
    "different tensors; cuDNN picks convolution algorithms by the workspace they need), cuBLAS/cuDNN workspaces "
    "and the CUDA context are the card profile's assumptions, and fragmentation follows the real allocation order. "
    "Confirm with `autobatch tune` on the card."
)
CAVEATS_CPU = (
    "estimate, not a measurement: the step ran under fake tensors; buffers MKL and oneDNN keep outside PyTorch's "
    "allocator are an assumed constant. Confirm with `autobatch tune --device cpu`."
)


@app.command(context_settings={"allow_interspersed_args": True})
def estimate(
    script: opt.Script = None,
    script_args: opt.ScriptArgs = None,
    config: opt.Config = None,
    card: Optional[str] = typer.Option(None, "--card", help="A named GPU profile (see --list-cards)."),
    list_cards: bool = typer.Option(False, "--list-cards", help="List the card profiles and exit."),
    device: opt.Device = None,
    memory: opt.Memory = None,
    headroom: opt.Headroom = None,
    precision: opt.Precisions = None,
    optimizer: opt.Optimizers = None,
    recompute: opt.Recompute = None,
    recompute_level: opt.RecomputeLevel = None,
    recompute_class: opt.RecomputeClass = None,
    batch_multiple: opt.BatchMultiple = None,
    max_batch_size: opt.MaxBatchSize = None,
    timeout: opt.Timeout = None,
    check_batch_size: opt.CheckBatchSize = None,
    seq_lens: opt.SeqLen = None,
    seq_len: opt.PlanSeqLen = None,
    strategy: opt.Strategy = None,
    world_size: opt.WorldSize = None,
    nproc_per_node: opt.NprocPerNode = None,
    nnodes: opt.Nnodes = None,
    plot: opt.Plot = None,
    as_json: opt.Json = False,
    verbose: opt.Verbose = False,
    quiet: opt.Quiet = False,
) -> None:
    """Predict each combination's maximum batch on a card (or the CPU) with fake tensors: no real allocation."""
    from autobatch.explain.pure.cards import CARDS

    if list_cards:
        _print_cards(CARDS, as_json)
        return
    settings = opt.load(locals())
    script_path = settings.require_script()
    check_script_path(script_path)
    if plot is not None:
        from autobatch.explain.output.plot import check_plot_path

        check_plot_path(plot)
    from autobatch.explain.parent.estimator import EstimateDevice, estimate_combinations

    target = EstimateDevice.resolve(
        card=card,
        device=settings.device.device,
        memory=settings.device.memory,
        headroom=settings.device.headroom,
        given_device=device is not None,
        memory_flag=settings.device.memory if memory else None,
    )
    console.print(f"[bold]autobatch estimate[/] {escape(script_path)}: {escape(target.describe())}")
    result = estimate_combinations(
        settings, target, progress=lambda text: console.print(f"[dim]  {escape(text)}[/]")
    )
    from autobatch.explain.output.render import print_estimate, print_estimate_lengths

    budget = result.device["budget_bytes"]
    at = f" at {result.lengths.plan_seq_len} tokens" if result.lengths else ""
    print_estimate(
        console,
        result,
        f"estimated maximum batch on {result.device['name']}{at} (budget {format_bytes(budget)})",
    )
    print_estimate_lengths(console, result)
    for note in result.notes:
        console.print(f"[dim]- {escape(note)}[/]")
    console.print(f"[yellow]note[/]: {escape(CAVEATS_CPU if target.kind == 'cpu' else CAVEATS_CUDA)}")
    if plot is not None:
        from autobatch.explain.output.plot import plot_tune

        plot_tune(result, plot)
        console.print(f"plot written to {plot} (points: simulated batch sizes)")
    if as_json:
        data: dict[str, Any] = {"estimate": True, **result.to_dict()}
        stdout_write(json.dumps(data, indent=2))
    _fail_if_nothing_simulated(result)


def _fail_if_nothing_simulated(result: Any) -> None:
    """Exit 6 (not 0) when no combination could be simulated: an estimate of nothing is not an answer."""
    failed = [c for c in result.combinations if (c.reason or "").startswith("cannot be simulated")]
    if failed and all(c.status == "skipped" for c in result.combinations):
        raise ProbeFailure(
            f"no combination could be simulated: {failed[0].reason or 'the simulation failed'}",
            hint="the step does something fake tensors cannot run (a data-dependent operation such as .item() "
            "or nonzero()); measure on a real device with `autobatch tune` instead (rerun with --verbose)",
        )


def _print_cards(cards: dict[str, Any], as_json: bool) -> None:
    from rich.table import Table

    table = Table(title="card profiles (memory as torch reports it; overheads assumed)")
    for column in ("card", "memory", "CUDA context", "workspaces", "bf16", "description"):
        table.add_column(column)
    for card in cards.values():
        table.add_row(
            card.name,
            format_bytes(card.memory_bytes),
            format_bytes(card.context_bytes),
            format_bytes(card.workspace_bytes),
            "yes" if card.bf16 else "no",
            card.description,
        )
    console.print(table)
    if as_json:
        stdout_write(json.dumps([card.to_dict() for card in cards.values()], indent=2))
