"""Human output of the probing commands, readable on a terminal and in a log file alike.

Three modes, chosen per run: **terminal** (stderr is a TTY: a live rich line for the probe in flight,
redrawn four times a second, each finished probe a line above it), **log** (a file or a pipe: plain
timestamped lines, never wrapped: :mod:`.app`'s console wraps nothing off a terminal) and **quiet**
(``--quiet``: errors and the final summary line only; errors alone when the answer goes to stdout as JSON).
``NO_COLOR`` turns colour off in every mode (:mod:`.app`); docs/commands.md shows the output.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.text import Text

from autobatch.cli.app import console
from autobatch.cli.state import STATE
from autobatch.core.units import format_bytes

if TYPE_CHECKING:
    from rich.console import RenderableType

    from autobatch.core.space import Combo
    from autobatch.records.protocol import ProbeOutcome, ProbeRequest, ProbeRunner
    from autobatch.service.hooks import Hooks


def timestamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


class Output:
    """Where a command's human output goes (see the module docstring)."""

    def __init__(self, *, quiet: bool | None = None, live: bool | None = None, as_json: bool = False) -> None:
        self.quiet = STATE.quiet if quiet is None else quiet
        self.as_json = as_json  # the command's answer goes to stdout as JSON (--json)
        self.live = (console.is_terminal and not self.quiet) if live is None else live
        self.display: LiveProbe | None = None

    @property
    def mode(self) -> str:
        return "quiet" if self.quiet else ("terminal" if self.live else "log")

    def line(self, message: str, *, style: str | None = None, markup: bool = False) -> None:
        """One event: a timestamped plain line in a log, as is on a terminal, nothing when quiet."""
        if self.quiet:
            return
        if self.live:
            console.print(message, style=style, markup=markup, highlight=False)
        else:
            console.print(f"{timestamp()} {message}", markup=markup, highlight=False)

    def status(self, message: str) -> None:
        self.line(message)

    def warning(self, message: str) -> None:
        self.line(f"warning: {message}", style="yellow")

    def wait(self, message: str) -> None:
        self.line(message, style="cyan")

    def summary(self, message: str) -> None:
        """The final summary line: printed in every mode, quiet included, except quiet with the answer on stdout as
        JSON (``--quiet --json``: stderr then holds errors alone, and the JSON holds what the line says)."""
        if self.quiet and self.as_json:
            return
        was, console.quiet = console.quiet, False
        try:
            prefix = "" if console.is_terminal else f"{timestamp()} "
            console.print(f"{prefix}{message}", markup=False, highlight=False, soft_wrap=True)
        finally:
            console.quiet = was

    def probe(self, combo: Combo, outcome: ProbeOutcome, cached: bool) -> None:
        """A finished probe (``cached``: answered from the journal)."""
        if self.quiet:
            return
        extra = f"peak {format_bytes(outcome.peak_bytes)}" if outcome.peak_bytes else ""
        if outcome.samples_per_second and outcome.kind == "fits":
            extra += f", {outcome.samples_per_second:,.0f} samples/s"
        if outcome.reason and outcome.kind != "fits":
            extra += f" ({outcome.reason})"
        took = "(cached)" if cached else f"{outcome.wall_seconds:.1f} s"
        if self.live:
            style = {"fits": "green", "oom": "yellow"}.get(outcome.kind, "red")
            console.print(
                f"  {combo.key:<38} batch {outcome.batch_size:>6} [{style}]{outcome.kind:<7}[/] {escape(extra)} {took}",
                highlight=False,
            )
        else:
            self.line(
                f"probe {combo.key} batch {outcome.batch_size} {outcome.kind} {extra} {took}".replace(
                    "  ", " "
                )
            )

    def watch(self, runner: ProbeRunner) -> ProbeRunner:
        """The runner, wrapped so that the live line follows its probes (unchanged outside a terminal)."""
        if not self.live:
            return runner
        self.display = self.display or LiveProbe()
        return WatchedRunner(runner, self.display)

    def hooks(self, **fields: Any) -> Hooks:
        """What the service tells a command, shown here; ``fields`` add or replace hooks."""
        from autobatch.service.hooks import Hooks

        shown: dict[str, Any] = {
            "on_probe": self.probe,
            "on_status": self.status,
            "on_warning": self.warning,
            "on_wait": self.wait,
            "wrap_runner": self.watch,
            "runner_factory": STATE.runner_factory,
        }
        return Hooks(**{**shown, **fields})

    def close(self) -> None:
        if self.display is not None:
            self.display.stop()
            self.display = None


class LiveProbe:
    """The live line: what the probe in flight is, how far it got, for how long."""

    def __init__(self) -> None:
        self.request: ProbeRequest | None = None
        self.started = 0.0
        self.folder = tempfile.mkdtemp(prefix="autobatch-progress-")
        self.path = os.path.join(self.folder, "step")
        self._live: Any = None
        self._lock = threading.Lock()

    def begin(self, request: ProbeRequest) -> None:
        from rich.live import Live

        try:
            os.unlink(self.path)
        except OSError:
            pass
        with self._lock:
            self.request, self.started = request, time.monotonic()
        if self._live is None:
            self._live = Live(self, console=console, refresh_per_second=4, transient=True)
            self._live.start()

    def end(self) -> None:
        with self._lock:
            self.request = None

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        shutil.rmtree(self.folder, ignore_errors=True)  # the probes' progress file, if one was written

    def text(self) -> str:
        from autobatch.probe.progress import read_progress

        with self._lock:
            request, started = self.request, self.started
        if request is None:
            return ""
        elapsed = time.monotonic() - started
        if request.op not in PROBES:
            return f"{request.op}: building the model on {request.device}, {elapsed:.1f} s"
        steps = (
            f"{request.min_steps}"
            if request.min_steps == request.max_steps
            else f"{request.min_steps}-{request.max_steps}"
        )
        done, waiting = read_progress(self.path)
        where = f"step {min((done or 0) + 1, request.max_steps)} of {steps}"
        if waiting:  # a script run as it is: its steps count once every optimizer has stepped
            where = f"step {(done or 0) + 1}, {waiting}"
        step = request.step
        key = f"{step.precision}/{step.optimizer}/{'recompute' if step.recompute else 'no-recompute'}"
        return f"probing {key} batch {request.batch_size}: {where}, {elapsed:.1f} s"

    def __rich__(self) -> RenderableType:
        return Text(self.text(), style="cyan")


#: The operations the live line follows step by step (a script run as it is: its own steps).
PROBES = ("probe", "as_is")


class WatchedRunner:
    """A :class:`~autobatch.records.protocol.ProbeRunner` that shows each request on the live line."""

    def __init__(self, inner: ProbeRunner, display: LiveProbe) -> None:
        self.inner, self.display = inner, display
        self.torch_version = inner.torch_version

    def run(self, request: ProbeRequest) -> ProbeOutcome:
        from autobatch.probe.progress import OPTION

        if request.op in PROBES:
            request = replace(request, options={**request.options, OPTION: self.display.path})
        self.display.begin(request)
        try:
            return self.inner.run(request)
        finally:
            self.display.end()

    def close(self) -> None:
        self.inner.close()
