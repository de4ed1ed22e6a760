"""The ``autobatch`` command's entry point: the daemon's door first, then the Typer app.

:func:`main` is what the console script and ``python -m autobatch`` run. It asks the daemon first
(:func:`autobatch.daemon.client.route`: ``tune``, ``check``, ``explain``, ``estimate`` with the ``daemon``
setting on), before Typer, rich, the command modules or torch are imported, so that a command the daemon
answers costs its client little more than the interpreter's start. Anything else (or the daemon off,
absent, or failing) runs in this process: :func:`autobatch.cli.root.main`, with the same errors and exit
codes. The Typer app, with every command registered, is :data:`autobatch.cli.root.app`.

Before anything else it guards the standard streams (:mod:`autobatch.cli.streams`: a log or a pipe that cannot
be written is dropped, never the work) and turns SIGTERM and SIGHUP into interrupts (:func:`on_signal`).
"""

from __future__ import annotations

import signal
import sys
from typing import Any

#: The signals that ended the command (SIGTERM, SIGHUP), for its last message and exit code (128 + the first).
signalled: list[int] = []


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (a scheduler's preemption, a closed ssh session), delivered as an interrupt so that the
    clean-up of Ctrl-C runs: the probes stopped, what they measured kept, the result marked, the locks released."""


def on_signal(signum: int, frame: Any) -> None:
    signalled.append(signum)
    raise Terminated()


def main() -> None:
    """Entry point of the ``autobatch`` command."""
    from autobatch.cli import streams

    streams.guard()
    for each in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(each, on_signal)
    failed: BaseException | None = None
    try:
        from autobatch.daemon.client import route

        routed = route(sys.argv[1:])  # the daemon's answer, or None: run here
    except BaseException as exc:  # noqa: BLE001  # reported as the in-process command reports it
        failed = exc
    else:
        if routed is not None:
            sys.exit(routed)
    from autobatch.cli.root import main as in_process

    in_process(failed)


__all__ = ["main"]
