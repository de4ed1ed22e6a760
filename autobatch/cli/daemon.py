"""``autobatch serve`` (the daemon in the foreground) and ``autobatch daemon start|stop|status|logs|cancel``."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from autobatch.cli import options as opt
from autobatch.cli.app import app, console, stdout_write

daemon_app = typer.Typer(
    help="Manage your autobatch daemon on this node (docs/daemon.md): start, stop, status, logs, cancel.",
    no_args_is_help=True,
)
app.add_typer(daemon_app, name="daemon")

Idle = Annotated[
    Optional[float],
    typer.Option(
        "--idle", min=1, help="Seconds without a request before the daemon exits (default: daemon_idle)."
    ),
]


def _idle(given: float | None) -> float:
    if given is not None:
        return given
    from autobatch.settings import load_settings

    return load_settings().daemon.daemon_idle


@app.command()
def serve(idle: Idle = None, verbose: opt.Verbose = False, quiet: opt.Quiet = False) -> None:
    """Run your autobatch daemon in the foreground (for systemd, supervisord, SLURM); logs on stderr."""
    from autobatch.daemon.place import Place
    from autobatch.daemon.server import serve as run

    run(Place.default(), _idle(idle))


@daemon_app.command()
def start(idle: Idle = None, verbose: opt.Verbose = False, quiet: opt.Quiet = False) -> None:
    """Start your daemon in the background (nothing happens when a compatible one runs)."""
    from autobatch.daemon.client import Client

    status = Client().start(_idle(idle))
    console.print(f"autobatch daemon running: pid {status['pid']}, socket {status['socket']}")


@daemon_app.command()
def stop(verbose: opt.Verbose = False, quiet: opt.Quiet = False) -> None:
    """Stop your daemon: running requests end as interrupted runs do, keeping what they measured."""
    from autobatch.daemon.client import Client

    console.print("autobatch daemon stopped" if Client().stop() else "no autobatch daemon runs")


@daemon_app.command()
def status(
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON on stdout.")] = False,
    verbose: opt.Verbose = False,
    quiet: opt.Quiet = False,
) -> None:
    """Show your daemon: versions, uptime, the inventory it serves, the requests running and queued, its warm
    parents. Exit 1 when none runs."""
    from autobatch.daemon.client import Client

    answer = Client().status()
    if as_json:
        stdout_write(json.dumps(answer or {"running": False}, indent=2))
    if answer is None:
        if not as_json:
            console.print("no autobatch daemon runs")
        raise typer.Exit(1)
    if as_json:
        return
    who = answer["identity"]
    console.print(
        f"autobatch daemon pid {answer['pid']}, up {answer['uptime_seconds']:.0f} s, {answer['served']} request(s) "
        f"served; autobatch {who['autobatch']}, torch {who['torch'] or '(none)'}; socket {answer['socket']}"
    )
    from autobatch.core.units import format_bytes

    for warm in (w for w in answer.get("warm_processes", []) if not w["own"]):
        variables = " ".join(f"{k}={v}" for k, v in warm["load_time_env"].items())
        console.print(
            f"  warm process pid {warm['pid']} (since {warm['since']}) for {variables}", markup=False
        )
    counts = answer.get("inventory")
    if counts and counts["reads"]:
        console.print(
            f"  inventory: {counts['reads']} read(s) served; NVML started {counts['starts']} time(s), the GPUs' "
            f"fixed facts read {counts['fixed_reads']} time(s)"
        )
    for parent in answer.get("warm_parents", []):
        limit = (
            f", imported under a data limit of {format_bytes(parent['data_limit'])}"
            if parent["data_limit"]
            else ""
        )
        console.print(
            f"  warm parent pid {parent['pid']} ({parent['state']}, since {parent['since']}, {parent['served']} "
            f"request(s)): {', '.join(parent['modules'])} for {parent['cwd']}{limit}",
            markup=False,
        )
    for spare in answer.get("spares", []):
        console.print(f"  spare fresh process pid {spare['pid']} (since {spare['since']})", markup=False)
    for request in answer["requests"]:
        where = f" on {request['device']}" if request["device"] else ""
        console.print(
            f"  {request['id']}  {request['state']}{where}  autobatch {' '.join(request['argv'])}  "
            f"(pid {request['pid']}, since {request['since']}, in {request['cwd']})",
            markup=False,
        )


@daemon_app.command()
def logs(
    lines: Annotated[
        int, typer.Option("--lines", "-n", min=1, help="How many of the last lines to show.")
    ] = 50,
    verbose: opt.Verbose = False,
    quiet: opt.Quiet = False,
) -> None:
    """Print the end of your daemon's log (a daemon started with `autobatch daemon start`)."""
    from autobatch.daemon.place import Place

    path = Place.default().log
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        console.print(f"no daemon log at {path}")
        return
    stdout_write("\n".join(text.splitlines()[-lines:]))


@daemon_app.command()
def cancel(
    request_id: Annotated[str, typer.Argument(help="The request's id, as status shows it (r12).")],
    verbose: opt.Verbose = False,
    quiet: opt.Quiet = False,
) -> None:
    """End one request: its command stops its probes and keeps what it measured, as an interrupted run does."""
    from autobatch.daemon.client import Client

    Client().cancel(request_id)
    console.print(f"cancelled {request_id}")
