"""``autobatch devices``: every visible GPU (NVML) and the host's memory, without starting torch.

Each GPU with the index this process (and torch, under autobatch's PCI bus order) sees it as under
``CUDA_VISIBLE_DEVICES``, its name, UUID, total, used and free memory, the processes holding memory on
it and how much, and its MIG instances. Without an NVIDIA driver: the host's memory and one line that
says why there is no GPU. ``--json`` prints the same as JSON on stdout
(:meth:`autobatch.devices.inventory.Inventory.to_dict`).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from rich.table import Table

from autobatch.cli import options as opt
from autobatch.cli.app import app, console, stdout_write
from autobatch.cli.progress import Output
from autobatch.core.units import format_bytes

if TYPE_CHECKING:
    from autobatch.devices.inventory import Gpu, Inventory


@app.command("devices")
def devices(
    as_json: bool = typer.Option(False, "--json", help="Print the inventory as JSON on stdout."),
    node_type: bool = typer.Option(
        False,
        "--node-type",
        help="Print only a file-name-safe name of this node's GPUs on stdout (job scripts).",
    ),
    verbose: opt.Verbose = False,
    quiet: opt.Quiet = False,
) -> None:
    """List the visible GPUs (memory, processes, MIG instances) and the host's memory."""
    from autobatch.devices import inventory as inv

    inventory = inv.read_inventory()
    if node_type:
        stdout_write(inv.node_type(inventory))
        return
    out = Output(as_json=as_json)
    host = inventory.host
    limit = f", cgroup limit {format_bytes(host.cgroup_limit_bytes)}" if host.cgroup_limit_bytes else ""
    out.status(
        f"host {host.hostname}: {format_bytes(host.total_bytes)} total, {format_bytes(host.available_bytes)} "
        f"available{limit}"
    )
    if inventory.no_gpu:
        out.status(f"no GPU: {inventory.no_gpu}")
    if inventory.gpus and not out.quiet:
        console.print(gpu_table(inventory))
        _processes(inventory, out)
    for note in inventory.notes:
        out.status(f"note: {note}")
    if out.quiet:
        out.summary(summary(inventory))
    if as_json:
        stdout_write(json.dumps(inventory.to_dict(), indent=2))


def summary(inventory: Inventory) -> str:
    """One line: how many GPUs of which models, and the host's memory."""
    host = inventory.host
    memory = f"host {format_bytes(host.total_bytes)}, {format_bytes(host.available_bytes)} available"
    visible = inventory.visible()
    if not visible:
        return f"no visible GPU ({inventory.no_gpu}); {memory}"
    models = Counter(f"{g.name} ({format_bytes(g.total_bytes or 0)})" for g in visible)
    each = ", ".join(f"{n} x {model}" for model, n in models.items())
    return f"{len(visible)} visible GPU(s): {each}; driver {inventory.driver_version}; {memory}"


def gpu_table(inventory: Inventory) -> Table:
    table = Table(
        title=f"GPUs: driver {inventory.driver_version}, CUDA {inventory.cuda_driver_version}; {inventory.visibility}"
    )
    for column in ("cuda", "name", "UUID", "total", "used", "free", "processes", "note"):
        table.add_column(
            column, justify="right" if column in ("total", "used", "free", "processes") else "left"
        )
    for gpu in inventory.gpus:
        _row(table, gpu, "")
        for instance in gpu.mig:
            _row(table, instance, "  MIG ")
    return table


def _row(table: Table, gpu: Gpu, prefix: str) -> None:
    index = f"cuda:{gpu.index}" if gpu.index is not None else "not visible"
    table.add_row(
        prefix + index,
        escape(gpu.name),
        gpu.uuid,
        format_bytes(gpu.total_bytes) if gpu.total_bytes is not None else "?",
        format_bytes(gpu.used_bytes) if gpu.used_bytes is not None else "?",
        format_bytes(gpu.free_bytes) if gpu.free_bytes is not None else "?",
        str(len(gpu.processes)),
        escape("; ".join(gpu.notes)),
    )


def _processes(inventory: Inventory, out: Output) -> None:
    for gpu in (g for top in inventory.gpus for g in (top, *top.mig)):
        where = f"cuda:{gpu.index}" if gpu.index is not None else gpu.uuid
        for proc in gpu.processes:
            name = proc.name or "not in this PID namespace"
            used = format_bytes(proc.used_bytes) if proc.used_bytes is not None else "unknown"
            out.status(f"{where}: pid {proc.pid} ({name}) holds {used}")
        if gpu.unlisted_bytes:
            why = (
                "processes NVML does not list, as in a container"
                if gpu.reserved_bytes is not None
                else "the driver's reservation, which this driver counts as used, or processes NVML does not list"
            )
            out.status(
                f"{where}: {format_bytes(gpu.unlisted_bytes)} in use that no listed process accounts for ({why})"
            )
