"""Telling a live tune from a dead one by its result file.

The file's ``status`` is ``running`` from the tune's start (or when it was killed outright and could not say
so: :func:`run_state` checks whether its ``pid`` on ``host`` still lives, and started before the file),
``complete``, ``interrupted`` or ``failed``. The fields: docs/result-file.md.
"""

from __future__ import annotations

import datetime
import socket
from typing import Any, Literal

RunState = Literal["alive", "dead", "unknown", "finished"]


def run_state(result: dict[str, Any]) -> RunState:
    """``finished`` for any status but running; else whether the run's process is ``alive`` or ``dead``
    (``unknown`` on another host, or for files written before ``pid`` was recorded)."""
    if result.get("status") != "running":
        return "finished"
    pid, host = result.get("pid"), result.get("host")
    if not isinstance(pid, int) or host != socket.gethostname():
        return "unknown"
    import psutil

    try:
        started = psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
        return "dead"
    created = _timestamp(result.get("created"))
    if created is not None and started > created + 1:
        return "dead"  # the pid was reused by a later process
    return "alive"


def unfinished(result: dict[str, Any]) -> str | None:
    """What to say of a result whose tune did not finish (None for a complete one): a launcher config
    must not be written from it, and "nothing fits" would be the wrong reason."""
    status = result.get("status")
    if status == "complete":
        return None
    if status == "running":
        state = run_state(result)
        who = f"process {result.get('pid')} on {result.get('host')}"
        if state == "alive":
            return f"the tune that writes this result is still running ({who})"
        if state == "dead":
            return f"the tune that wrote this result was killed before it finished ({who} is gone)"
        return "the tune that wrote this result had not finished when it last wrote it (status running)"
    if status == "interrupted":
        return "the tune that wrote this result was interrupted (SIGINT, SIGTERM or SIGHUP) before it chose"
    if status == "failed":
        return "the tune that wrote this result failed before it chose (its notes say why)"
    return None


#: How to get a finished result from an unfinished one.
RESUME_HINT = (
    "run the same `autobatch tune` again (wait for a live one to finish): it resumes from the probes it "
    "already measured (the probe journal); the json and toml formats still write the partial result"
)


def _timestamp(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None
