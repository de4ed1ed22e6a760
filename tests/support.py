"""Paths and helpers shared by the tests (imported by name: tests/ is on sys.path under pytest)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run the real command (`python -m autobatch`) in a subprocess."""
    full_env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "autobatch", *args],
        cwd=cwd or ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_main(*args: str) -> tuple[int, str, str]:
    """Run the command's ``main()`` in this process, in Typer's CliRunner isolation.

    Returns (exit code, stdout, stderr with white space folded). ``main()`` maps autobatch's errors to
    their documented exit codes, as the installed command does.
    """
    from typer.testing import CliRunner

    from autobatch.cli import main

    runner = CliRunner()
    argv = sys.argv
    sys.argv = ["autobatch", *args]
    try:
        with runner.isolation() as (out, err, _):
            try:
                main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            return code, out.getvalue().decode(), " ".join(err.getvalue().decode().split())
    finally:
        sys.argv = argv
