"""What a command forked by the daemon tells it while it runs: the device lock it waits for or holds.

The daemon hands each request's command a pipe (:func:`attach`); :class:`autobatch.run.locks.RunLock` reports
on it (:func:`report`), so ``autobatch daemon status`` shows which requests run on which device and which
wait in its queue. The queue is the device lock itself, shared with runs made without the daemon. Outside a
daemon's request nothing is attached and :func:`report` does nothing.
"""

from __future__ import annotations

import json
import os
import time

_fd: list[int] = []


def attach(fd: int) -> None:
    """Report on the file descriptor ``fd`` (the write end of the daemon's pipe) from now on."""
    _fd[:] = [fd]


def report(state: str, device: str) -> None:
    """``state`` ("queued", "running", "released") of the lock of ``device`` (its label in messages), stamped
    with the time it is reported ("running" once the lock is held, "released" before it is let go)."""
    if not _fd:
        return
    event = {"state": state, "device": device, "at": time.time()}
    try:
        os.write(_fd[0], (json.dumps(event) + "\n").encode())
    except OSError:
        pass  # the daemon stopped listening: only its status is poorer


def inside() -> bool:
    """Is this process a command the daemon runs (so it must not go through the daemon again)?"""
    return bool(_fd)
