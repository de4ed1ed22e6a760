"""``autobatch validate``: check a settings file without running anything.

It loads the file as ``tune`` would (with the ``AUTOBATCH_*`` variables unless ``--no-env``), also
requires the script and the DeepSpeed base config to exist, and either prints ``ok: FILE`` with a
short summary (stderr) or raises one :class:`~autobatch.errors.ConfigError` listing every problem
(exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from autobatch.cli import options as opt
from autobatch.cli.app import app, console, stdout_write

if TYPE_CHECKING:
    from autobatch.settings import Settings


@app.command("validate")
def validate(
    file: Optional[Path] = typer.Argument(
        None, help="Settings file (default: ./autobatch.toml).", show_default=False
    ),
    use_env: bool = typer.Option(
        True, "--env/--no-env", help="Apply the AUTOBATCH_* variables, as tune does."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the effective settings as JSON on stdout."),
    verbose: opt.Verbose = False,
    quiet: opt.Quiet = False,
) -> None:
    """Check a settings file (every key, type and value, and that the script exists) without running it."""
    from autobatch.settings import DEFAULT_FILE, load_settings

    path = file if file is not None else Path(DEFAULT_FILE)
    settings = load_settings(config=path, env=None if use_env else {}, check_paths=True)
    if use_env:
        import os

        opt.warn_stray_variables(os.environ)
    console.print(f"ok: {path}", markup=False, highlight=False)
    for line in summary(settings):
        console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
    if as_json:
        stdout_write(json.dumps(settings.to_dict(), indent=2))


def summary(settings: Settings) -> list[str]:
    """A few lines that say what a tune with these settings would do."""
    from autobatch.core.units import format_bytes

    script, device, search, plan, probe, output = (
        settings.script, settings.device, settings.search, settings.plan, settings.probe, settings.output,
    )  # fmt: skip
    combos = len(search.precisions) * len(search.optimizers) * len(search.recompute) * len(search.compile)
    compiled = f" x {len(search.compile)} compile" if len(search.compile) > 1 else ""
    if search.compile == (True,):
        compiled = " (compiled)"
    lengths = f"; lengths {', '.join(map(str, search.seq_lens))}" if search.seq_lens else ""
    plan_len = plan.seq_len or (max(search.seq_lens) if search.seq_lens else None)
    plan_length = f", at {plan_len} tokens" if plan_len else ""
    memory = format_bytes(device.memory) if device.memory else "the device's capacity"
    world = plan.world_size if plan.world_size is not None else "from the environment"
    args = "".join(f" {arg}" for arg in script.script_args)
    source = (
        f"script   {_short(script.script)}{args}"
        if script.script
        else f"script   Hugging Face config {_short(script.hf)}"
        if script.hf
        else f"script   LightningModule {script.lightning}"
        if script.lightning
        else "script   not set: give SCRIPT (or --hf, --lightning) to tune"
    )
    lines = [
        source,
        f"device   {device.device}, memory {memory}, headroom {device.headroom:g}",
        f"search   {len(search.precisions)} precision(s) x {len(search.optimizers)} optimizer(s) x "
        f"{len(search.recompute)} recompute{compiled} = {combos} combination(s){lengths}; "
        f"batch multiple {search.batch_multiple}, up to {search.max_batch_size}",
        f"plan     global batch {plan.global_batch_size or 'not set'}{plan_length}, world size {world}, "
        f"objective {plan.objective}",
        f"probe    {probe.steps} steps (up to {probe.max_steps}), confirm {probe.confirm_steps}, "
        f"timeout {probe.timeout:g} s, cache {'on' if probe.cache else 'off'}",
        f"output   {output.result}" + (f"; emit {', '.join(output.emit)}" if output.emit else ""),
    ]
    from_env = sorted(origin for origin in settings.origins.values() if origin.startswith("AUTOBATCH_"))
    if from_env:
        lines.append("from the environment: " + ", ".join(from_env))
    return lines


def _short(path: str) -> str:
    """``path`` relative to the working directory when it lies below it."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path
