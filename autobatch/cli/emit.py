"""``autobatch emit``: write launcher configs from a saved result, without tuning again.

``autobatch emit RESULT_FILE --format FORMAT[=PATH] ...`` loads the result (``TuneResult.load``),
renders every requested file first (a rendering error writes nothing), writes each atomically, and
lists them on stderr with the batch arithmetic and each format's caveats. ``--json`` prints the
written paths on stdout.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Optional

import typer

from autobatch.cli import options as opt
from autobatch.cli.app import app, console, stdout_write
from autobatch.errors import UsageError


@app.command("emit")
def emit_command(
    result_file: Path = typer.Argument(
        ..., help="A result JSON written by `autobatch tune`.", show_default=False
    ),
    formats: list[str] = typer.Option(
        ...,
        "--format",
        "-f",
        show_default=False,
        help="FORMAT or FORMAT=PATH, repeatable; formats: deepspeed, hf, lightning, accelerate, env, args, json, toml.",
    ),  # fmt: skip
    output: Optional[Path] = typer.Option(
        None, "--output", "-o", help="Path of the file, when one --format is given without =PATH."
    ),
    base: Optional[Path] = typer.Option(
        None, "--base", help="Your DeepSpeed config to overlay (deepspeed format)."
    ),
    lightning_batch_key: Optional[str] = typer.Option(
        None,
        "--lightning-batch-key",
        help="Dotted key of the data module's batch size (default data.batch_size).",
    ),  # fmt: skip
    deepspeed_optimizer: bool = typer.Option(
        False,
        "--deepspeed-optimizer",
        help="Write an optimizer section into the DeepSpeed config even "
        "when the base has none (DeepSpeed then builds the optimizer, at its default learning rate).",
    ),  # fmt: skip
    allow_cpu: bool = typer.Option(
        False,
        "--allow-cpu",
        help="Write launcher configs from a result measured on the CPU although "
        "the CPU was not asked for (device auto found no GPU).",
    ),  # fmt: skip
    as_json: bool = typer.Option(False, "--json", help="Print the written paths as JSON on stdout."),
    verbose: opt.Verbose = False,
    quiet: opt.Quiet = False,
) -> None:
    """Write launcher configs (DeepSpeed, HF, Lightning, accelerate, env, args, json, toml) from a saved result."""
    from autobatch.emit import emit, make_options, parse_emit_spec, report
    from autobatch.records.result import TuneResult

    specs = [parse_emit_spec(spec) for spec in formats]
    if output is not None:
        if len(formats) != 1 or "=" in formats[0]:
            raise UsageError(
                "--output applies to exactly one --format without =PATH",
                hint="write each file as --format FORMAT=PATH",
            )
        specs = [(specs[0][0], output)]
    if base is not None and not any(fmt == "deepspeed" for fmt, _ in specs):
        raise UsageError(
            "--base is the DeepSpeed config to overlay, but no deepspeed format was asked for",
            hint="add --format deepspeed",
        )

    options = make_options(
        generated_by=_command_line(result_file, formats, output, base, lightning_batch_key)
        + "".join(
            f" {flag}"
            for flag, on in (("--deepspeed-optimizer", deepspeed_optimizer), ("--allow-cpu", allow_cpu))
            if on
        ),
        deepspeed_base=str(base) if base is not None else None,
        lightning_batch_key=lightning_batch_key,
        deepspeed_optimizer=deepspeed_optimizer,
        allow_cpu=allow_cpu,
    )
    result = TuneResult.load(result_file)
    written = emit(result, specs, options)
    for line in report(
        result, [(fmt, path) for (fmt, _), path in zip(specs, written, strict=False)], options
    ):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if as_json:
        stdout_write(
            json.dumps(
                {
                    "written": [
                        {"format": fmt, "path": str(path)}
                        for (fmt, _), path in zip(specs, written, strict=False)
                    ]
                }
            )
        )


def _command_line(
    result_file: Path, formats: list[str], output: Path | None, base: Path | None, key: str | None
) -> str:
    """The command as a person would type it, for the files' headers."""
    words = ["autobatch", "emit", str(result_file)]
    for fmt in formats:
        words += ["--format", fmt]
    for flag, value in (("--output", output), ("--base", base), ("--lightning-batch-key", key)):
        if value is not None:
            words += [flag, str(value)]
    return shlex.join(words)
