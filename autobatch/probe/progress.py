"""How far a probe in flight has got: the probe writes its step count to a small file the CLI reads.

Only when the request asks for it (``options["progress_file"]``, set by the CLI's live display on a
terminal): the probe process then writes the number of the step it finished, as ASCII digits, into
that file after each step, with bare ``os`` calls (a few bytes, no buffer: nothing that moves the
peak it measures); a probe of a script run as it is follows the digits with what it waits for
(``12 waiting for Adam's first step``). Nothing else of the probe changes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from autobatch.records.protocol import ProbeRequest

OPTION = "progress_file"


def reporting(peak_now: Callable[[], int], request: ProbeRequest, report: Any) -> Callable[[], int]:
    """``peak_now`` that also records the step count (the step loop reads the peak once per step)."""
    path = request.options.get(OPTION)
    if not path:
        return peak_now

    def peak_and_progress() -> int:
        value = peak_now()
        write_step(str(path), len(report.step_peaks) + 1)
        return value

    return peak_and_progress


def write_step(path: str, step: int, waiting: str = "") -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"%d %s" % (step, waiting.encode()) if waiting else b"%d" % step)
        finally:
            os.close(fd)
    except OSError:
        pass


def read_step(path: str) -> int | None:
    """The last step the probe finished (None: none yet, or no file)."""
    return read_progress(path)[0]


def read_progress(path: str) -> tuple[int | None, str]:
    """The last step the probe finished (None: none yet, or no file), and what it waits for ("": nothing)."""
    try:
        with open(path, "rb") as handle:
            step, _, waiting = handle.read(300).decode(errors="replace").partition(" ")
        return (int(step) if step.strip() else None), waiting
    except (OSError, ValueError):
        return None, ""
