"""Writing the result file so that a bad path or a full disk costs nothing already measured.

The output path is checked before any probe (:func:`autobatch.records.files.preflight`, with :data:`FIX`);
:class:`ResultSaver` writes the result atomically after every probe (a failed write is warned about once, the
tune goes on; :meth:`ResultSaver.finish` raises exit 2 naming the path and the fix); :func:`started_result` is what the file says from a run's start.
"""

from __future__ import annotations

import datetime
import errno
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from autobatch.errors import UsageError
from autobatch.settings.levers import neutral

if TYPE_CHECKING:
    from collections.abc import Callable

    from autobatch.records.result import TuneResult
    from autobatch.settings import Settings

FIX = f"pass {neutral('result', 'PATH')} (or set [output] result) to a file in a folder you can write"


def explain_os_error(path: Path, exc: OSError, what: str = "result file") -> UsageError:
    """The error for a write that failed: the path, the reason in words, and the fix."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return UsageError(
            f"cannot write the {what} {path}: the disk is full (no space left on device)",
            hint=f"free space on that disk, or {FIX} on another disk; the previous {path.name} is left as it was",
        )
    reason = exc.strerror or str(exc)
    return UsageError(
        f"cannot write the {what} {path}: {reason}", hint=f"{FIX}; nothing was measured in vain"
    )


class ResultSaver:
    """Saves the result after every probe; a failed write warns once, :meth:`finish` reports it."""

    def __init__(self, path: Path, warn: Callable[[str], None]) -> None:
        self.path = path
        self.warn = warn
        self.error: OSError | None = None

    def __call__(self, result: TuneResult) -> None:
        try:
            _write(self.path, result)
            self.error = None
        except OSError as exc:
            if self.error is None:
                self.warn(
                    f"cannot write {self.path} ({exc.strerror or exc}); probing goes on, "
                    "and the answer is shown at the end"
                )
            self.error = exc

    def finish(self, result: TuneResult) -> None:
        """Write the final result, or raise the error that names the path and the fix."""
        try:
            _write(self.path, result)
        except OSError as exc:
            raise explain_os_error(self.path, exc) from None


def _write(path: Path, result: TuneResult) -> None:
    from autobatch.records.files import write_atomic

    write_atomic(path, result.to_json() + "\n")


def started_result(settings: Settings, script: str) -> TuneResult:
    """The result file of a run that has started and measured nothing yet (see the module docstring)."""
    from autobatch.records.result import TuneResult
    from autobatch.records.version import __version__

    requested = settings.device.device
    return TuneResult(
        script=script,
        script_args=list(settings.script.script_args),
        device={
            "type": requested.partition(":")[0],
            "name": "not inspected yet",
            "requested": requested,
            "budget_bytes": 0,
        },  # fmt: skip
        objective=settings.plan.objective,
        combinations=[],
        status="running",
        autobatch_version=__version__,
        created=datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
        notes=["written as the run started, before it measured anything"],
        pid=os.getpid(),
        host=socket.gethostname(),
    )
