"""The Typer application object and the shared console (stderr). Commands register themselves here.

The console writes to whatever ``sys.stderr`` is when it prints: the guarded stream :func:`autobatch.cli.main`
installs (:mod:`autobatch.cli.streams`).
"""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console

app = typer.Typer(
    name="autobatch",
    help="Find the largest batch that fits your real PyTorch training step, and plan accumulation.",
    no_args_is_help=True,
    add_completion=True,  # autobatch --install-completion / --show-completion
    # Click's own help layout: wraps help text and never truncates a flag's name, at any width (the rich
    # layout cut --lightning-batch-key to "--lightning-batch-…" at 80 columns).
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


#: The console's width when stderr is not a terminal: no table is cut, each as wide as its content.
UNWRAPPED = 100_000


def _console_options() -> dict[str, object]:
    terminal = sys.stderr is not None and sys.stderr.isatty()
    return {
        "stderr": True,
        "no_color": bool(os.environ.get("NO_COLOR")),
        "highlight": False,
        # Not a terminal (a job's log, a file, a pipe): no line is ever wrapped, however long, and no table is cut
        # (docs/commands.md, "Output a log file can read").
        "width": None if terminal else UNWRAPPED,
        "soft_wrap": not terminal,
    }


#: Human output goes to stderr; stdout carries only machine-readable output (--json).
console = Console(**_console_options())  # type: ignore[arg-type]


def reset_console() -> None:
    """Set the console up again for this process's environment and stderr (a command the daemon forked)."""
    console.__init__(**_console_options())  # type: ignore[misc]


def stdout_write(text: str) -> None:
    """Write machine-readable output to stdout."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()
