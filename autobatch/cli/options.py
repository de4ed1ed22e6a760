"""Options shared by ``tune``, ``check`` and the commands that probe, declared once.

Every option defaults to ``None`` (not given) so that ``autobatch.toml`` and ``AUTOBATCH_*`` can fill
it in; the defaults themselves live only in :mod:`autobatch.settings`.
"""

from __future__ import annotations

from typing import Any

import typer


def _help(name: str) -> str:
    try:
        from ..settings import help_for

        return help_for(name)
    except Exception:  # noqa: BLE001 - help text must never break the CLI
        return ""


CONFIG = typer.Option(None, "--config", "-c", help="Settings file (default: ./autobatch.toml when present).")
DEVICE = typer.Option(None, "--device", "-d", help=_help("device"))
MEMORY = typer.Option(None, "--memory", "-m", help=_help("memory"))
HEADROOM = typer.Option(None, "--headroom", help=_help("headroom"))
PRECISION = typer.Option(None, "--precision", "-p", help=_help("precisions"))
OPTIMIZER = typer.Option(None, "--optimizer", "-o", help=_help("optimizers"))
RECOMPUTE = typer.Option(None, "--recompute/--no-recompute", help=_help("recompute"))
RECOMPUTE_CLASS = typer.Option(None, "--recompute-class", help=_help("recompute_classes"))
TIMEOUT = typer.Option(None, "--timeout", help=_help("timeout"))
JSON = typer.Option(False, "--json", help="Print the result as JSON on stdout.")
SCRIPT = typer.Argument(
    None, help="Training script (default: `script` in autobatch.toml).", show_default=False
)
SCRIPT_ARGS = typer.Argument(None, help="Arguments for the script, after `--`.", show_default=False)


def overrides(**values: Any) -> dict[str, Any]:
    """Flat setting name -> value for the flags that were given (None and empty lists are 'not given')."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if value is None or (isinstance(value, list) and not value):
            continue
        if name == "recompute":
            value = [bool(value)]
        out[name] = value
    return out
