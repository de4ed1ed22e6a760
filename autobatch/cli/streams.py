"""The command's standard streams, guarded: a log or a pipe that cannot be written never costs its work.

A tune runs unattended: its stderr is a job's log on a disk that fills, a pipe whose reader left
(``| head -1``, ``--json | true``), the terminal of an ssh session that closed, or no descriptor at all
(``2>&-``). :func:`guard` runs first in :func:`autobatch.cli.main`. A standard descriptor that is closed is
opened on ``/dev/null`` (else the next file the command opens, a lock or the result, would take its number and
receive what the command writes to it; a probe does not inherit it, as Python's descriptors are not), and ``sys.stdout`` and ``sys.stderr`` become
:class:`Guarded`. The first write or flush of one that fails (EPIPE, EBADF, ENOSPC, a closed file, no stream
at all) points its descriptor at ``/dev/null`` and drops what is written to it from then on, silently: the
command finishes, writes its result file and exits with the code it would have had. rich's console, logging,
warnings, Typer and click look ``sys.stderr`` and ``sys.stdout`` up when they write, so all of them go
through the guards. docs/commands.md ("Output a log file can read") says so to users.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO, cast


class Guarded:
    """A text stream over ``inner`` (None: there is none) whose failed writes and flushes drop it for good."""

    def __init__(self, inner: TextIO | None) -> None:
        self.inner = inner
        self.dropped = inner is None

    def write(self, text: str) -> int:
        if not self.dropped:
            try:
                return self.inner.write(text)  # type: ignore[union-attr]
            except UnicodeError:  # the text, not the stream: as an unguarded stream says it
                raise
            except (OSError, ValueError):  # ValueError: a closed file
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.dropped:
            try:
                self.inner.flush()  # type: ignore[union-attr]
            except (OSError, ValueError):
                self._drop()

    def isatty(self) -> bool:
        try:
            return not self.dropped and self.inner is not None and self.inner.isatty()
        except (OSError, ValueError):
            return False

    @property
    def encoding(self) -> str:
        return getattr(self.inner, "encoding", None) or "utf-8"

    def __getattr__(self, name: str) -> Any:  # fileno, errors, buffer, ...: the stream's own
        return getattr(self.inner, name)

    def _drop(self) -> None:
        """From now on nothing reaches the stream; what its buffer still holds goes to /dev/null when the
        interpreter flushes it on the way out (else Python reports the failure and exits 120), and so does what
        a process started from now on writes to the descriptor."""
        self.dropped = True
        try:
            fd = self.inner.fileno()  # type: ignore[union-attr]
            null = os.open(os.devnull, os.O_WRONLY)
        except (
            OSError,
            ValueError,
            AttributeError,
        ):  # io.UnsupportedOperation is an OSError and a ValueError
            return
        try:
            os.dup2(null, fd)
        except OSError:
            pass
        finally:
            os.close(null)


def guard() -> None:
    """Open every closed standard descriptor on /dev/null and guard ``sys.stdout`` and ``sys.stderr`` (once)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(
                os.devnull, os.O_RDWR
            )  # the lowest free number: this one, when those below are open
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if not isinstance(sys.stdout, Guarded):
        sys.stdout = cast(TextIO, Guarded(sys.stdout))
    if not isinstance(sys.stderr, Guarded):
        sys.stderr = cast(TextIO, Guarded(sys.stderr))
