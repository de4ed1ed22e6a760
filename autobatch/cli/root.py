"""The ``autobatch`` command in this process: a thin Typer app, one module per command.

``main()`` catches :class:`autobatch.errors.AutobatchError` once, prints ``error:`` and ``hint:`` to
stderr and exits with the error's documented code (no traceback unless ``--verbose``). SIGINT exits
with 130, SIGTERM with 143 and SIGHUP with 129 (128 + the signal), after the command has cleaned up its probe
processes. It runs what the daemon
did not answer (:func:`autobatch.cli.main` asks it first).
"""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable
from typing import Any, Optional

import typer
from rich.markup import escape

# Command modules register themselves on `app` when imported (keep this list; one line per module).
from autobatch.cli import check, emit, init, tune, validate  # noqa: E402,F401,I001
from autobatch.errors import EXIT_INTERNAL, EXIT_SIGINT, EXIT_USAGE, AutobatchError

from autobatch.cli import cache, devices  # noqa: E402,F401  # isort: skip

from autobatch.cli import estimate, explain  # noqa: E402,F401  # isort: skip
from autobatch.cli import lengths  # noqa: E402,F401  # isort: skip
from autobatch.cli import run  # noqa: E402,F401  # isort: skip
from autobatch.cli import daemon  # noqa: E402,F401  # isort: skip
from autobatch.cli import signalled
from autobatch.cli.app import app, console
from autobatch.cli.state import STATE


@functools.cache  # `cache` is the command module
def command() -> Callable[..., Any]:
    """The app as Click's command, built once a process (Typer builds it from the functions on every call):
    the daemon's warm process builds it, and every command forked from it runs it as built."""
    import typer.main

    return typer.main.get_command(app)


def _version(value: bool) -> None:
    if value:
        from autobatch.records.version import __version__

        typer.echo(f"autobatch {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Optional[bool] = typer.Option(
        None, "--version", callback=_version, is_eager=True, help="Show the version and exit."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks and probe logs on errors."),
    quiet: bool = typer.Option(
        False,
        "--quiet",
        "-q",
        help="Print only errors and the final summary line (errors alone with --json).",
    ),
) -> None:
    STATE.verbose = STATE.verbose or verbose
    STATE.quiet = STATE.quiet or quiet
    console.quiet = STATE.quiet


def main(failed: BaseException | None = None) -> None:
    """Run ``autobatch ARGS`` here; ``failed``: what asking the daemon raised, reported as the command's own."""
    ours = (
        sys.argv[1 : sys.argv.index("--")] if "--" in sys.argv else sys.argv[1:]
    )  # the script's come after --
    STATE.verbose = "--verbose" in ours or "-v" in ours
    STATE.quiet = "--quiet" in ours or "-q" in ours
    console.quiet = STATE.quiet
    try:
        if failed is not None:
            raise failed
        # Typer (non-standalone) returns typer.Exit's code, and 130 for a KeyboardInterrupt.
        code = command()(standalone_mode=False, prog_name="autobatch")
    except AutobatchError as exc:
        report_error(exc)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        code = EXIT_SIGINT
    except Exception as exc:  # click's usage errors (Typer may vendor click) and anything unexpected
        if callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int):
            exc.show()  # type: ignore[attr-defined]
            sys.exit(EXIT_USAGE if exc.exit_code == 2 else exc.exit_code)  # type: ignore[attr-defined]
        if STATE.verbose:
            raise
        console.quiet = False
        console.print(f"[red bold]error[/]: internal error: {type(exc).__name__}: {escape(str(exc))}")
        console.print("[cyan]hint[/]: rerun with --verbose for the traceback, and report it")
        sys.exit(EXIT_INTERNAL)
    if code == EXIT_SIGINT or signalled:
        what = ENDED_BY.get(signalled[0], "terminated") if signalled else "interrupted"
        console.quiet = False
        console.print(f"[yellow]{what}[/]: probes stopped; the probes measured so far are kept")
        sys.exit(128 + signalled[0] if signalled else EXIT_SIGINT)
    if isinstance(code, int) and code != 0:
        sys.exit(code)


#: What the last line calls the end a signal made (SIGINT: "interrupted").
ENDED_BY: dict[int, str] = {signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}


def report_error(exc: AutobatchError) -> None:
    """``error:``, the detail with --verbose, ``hint:``; a lever a text names in the neutral form (an error that
    did not leave through the service, which renders them) is the command's flag."""
    from autobatch.service.hooks import error_in_words

    error_in_words(exc, "cli")
    console.quiet = False  # errors print under --quiet too
    console.print(f"[red bold]error[/]: {escape(exc.message)}", highlight=False)
    if exc.detail and STATE.verbose:
        console.print(exc.detail, markup=False, highlight=False)
    elif exc.detail:
        console.print("(rerun with --verbose for details)", style="dim")
    if exc.hint:
        console.print(f"[cyan]hint[/]: {escape(exc.hint)}", highlight=False)


__all__ = ["app", "main"]
