"""``autobatch init``: write a commented starter ``autobatch.toml`` with every key and its default.

The file comes from :func:`autobatch.settings.render_starter_toml`, so it always matches the settings
the code accepts, and it loads back to the defaults as written.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from autobatch.cli import options as opt
from autobatch.cli.app import app, console
from autobatch.errors import UsageError


@app.command("init")
def init(
    path: Path = typer.Argument(Path("autobatch.toml"), help="File to write.", show_default=True),
    force: bool = typer.Option(False, "--force", "-f", help="Overwrite the file if it exists."),
    verbose: opt.Verbose = False,
    quiet: opt.Quiet = False,
) -> None:
    """Write a commented starter autobatch.toml: every key, its default and what it does."""
    from autobatch.records.files import write_atomic
    from autobatch.settings import render_starter_toml

    if path.is_dir():
        raise UsageError(f"{path} is a folder", hint=f"give a file name, such as {path / 'autobatch.toml'}")
    if path.exists() and not force:
        raise UsageError(f"{path} already exists", hint="pass --force to overwrite it, or give another PATH")
    write_atomic(path, render_starter_toml())
    console.print(f"wrote {escape(str(path))}")
    check = "autobatch validate" + ("" if path == Path("autobatch.toml") else f" {path}")
    console.print(f"next: set `script` under [script], then check the file with `{check}`", markup=False)
