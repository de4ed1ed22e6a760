"""A spare fresh process: the job's fresh process started ahead by the daemon, torch imported, waiting.

The job's fresh process (:mod:`autobatch.probe.fresh`) is a new ``python`` that imports torch, then the script,
and runs the steps; most of its start is torch's import (about 3 s of a tune through the daemon). The daemon
(:mod:`autobatch.daemon.spares`) keeps one started ahead: ``python -m autobatch.probe.fresh --spare FD``, started
with the environment a request's fresh process had, in an empty folder, which imports what the fresh process
imports before its start message (its own modules, psutil, torch) and then waits on the listening socket
``FD``. A later request's fresh-process measurement, of the same key (:func:`spare_key`), takes it
instead of starting a new process (:func:`take`): the start message, the report pipe and the output go to it
over the socket, and it runs on as the new process would have.

It is the same process only where nothing it read before its start differs from what a new one would read:

* the environment at its start (what the interpreter, glibc, OpenMP and torch read as they load) is the
  request's whole, but for what a shell sets per command, what a scheduler sets to name the job and
  autobatch's own variables (:func:`spare_key`: none of them is read before the script); the rest it takes
  at its start message, as a new process would find it;
* the interpreter's site folders (a package installed since: another key);
* checked by the spare itself (:func:`refusal`): the data and address-space limits and the cores it may run on
  (read as libraries load) are the taker's; no entry of the taker's working folder (first on a new process's
  ``sys.path``, where the spare had an empty folder) is named as a module the spare imported; ``PYTHONPATH``
  has no relative folder (made absolute from the folder the interpreter starts in). It then takes the
  working folder, and puts it first on ``sys.path`` as ``python -m`` would have.

Anything else, and a spare that is not there, refuses or is slow: the measurement starts a new process, as
without the daemon. A spare taken is not the taker's child: its end is read from a pidfd, it is ended by its
pid, and it ends itself when the taker's end of the socket closes (the taker died: ``SIGHUP`` through
``O_ASYNC``, as a new process's parent's death sends it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from autobatch.records.protocol import read_start_word, start_word

#: The fresh process's first argument that makes it a spare (the listening socket's descriptor follows).
SPARE_FLAG = "--spare"
#: Largest message on a spare's socket (the start message itself goes in a file: :func:`start_word`).
MESSAGE = 1 << 16
#: Seconds a taker waits for a spare's answer (a spare still importing torch: it answers once it has).
ANSWER_WAIT = 120.0
#: Prefixes of autobatch's own variables: read by autobatch as it runs, never as the interpreter or torch load.
OWN_VARIABLES = ("AUTOBATCH_",)

#: Where a command the daemon runs asks for a spare (:func:`served_by`); None: no daemon, no spare.
_source: Callable[[dict[str, Any]], str | None] | None = None
#: The taker's end of the socket, in the spare once taken (its close is the spare's hang-up).
_held: socket.socket | None = None


def served_by(source: Callable[[dict[str, Any]], str | None] | None) -> None:
    """Ask ``source`` for a spare before the job's fresh process is started (a command the daemon runs): it
    takes what :func:`asked` describes and answers the path of a spare's socket, or None."""
    global _source
    _source = source


def process_bounds() -> dict[str, Any]:
    """What a process starts with that libraries read as they load, beside the environment: its data and
    address-space limits, the cores it may run on."""
    return {
        "limits": [
            list(resource.getrlimit(resource.RLIMIT_DATA)),
            list(resource.getrlimit(resource.RLIMIT_AS)),
        ],
        "cores": sorted(os.sched_getaffinity(0)),
    }


def asked(env: Mapping[str, str]) -> dict[str, Any]:
    """What a new fresh process of environment ``env``, started here, would start with: what a spare must match."""
    return {
        "env": dict(env),
        "cwd": os.getcwd(),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        **process_bounds(),
    }


@dataclass
class Taken:
    """A spare that took a start message: its pid, and the connection its taker holds while it runs."""

    pid: int
    connection: socket.socket


def take(
    start: dict[str, Any], env: Mapping[str, str], folder: str, report_fd: int, quiet: bool
) -> tuple[Taken | None, str]:
    """Hand ``start`` (with ``env``, its start file in ``folder``), the report pipe ``report_fd`` and this process's
    output (``quiet``: none) to a spare of this environment and folder: ``(Taken, "taken")``, or ``(None, why
    not)`` (``""``: not a command the daemon runs); the caller then starts a new process."""
    if _source is None:
        return None, ""
    if not hasattr(os, "pidfd_open"):  # a spare is no child of the taker: its end is read from a pidfd
        return None, "no pidfd to read a spare's end from"
    this = asked(env)
    try:
        path = _source(this)
    except Exception as exc:  # noqa: BLE001 - the daemon's trouble: a new process, as without it
        return None, f"the daemon did not answer ({exc})"
    if path is None:
        return None, "none ready"
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    null = os.open(os.devnull, os.O_WRONLY) if quiet else None
    try:
        connection.settimeout(ANSWER_WAIT)
        connection.connect(path)
        word = start_word({**start, SPARE_ENV: dict(env)}, folder)
        message = {"word": word, "umask": _umask(), **this}
        del message["env"]
        outputs = [null, null] if null is not None else [1, 2]
        socket.send_fds(connection, [json.dumps(message).encode()], [report_fd, *outputs])
        answer = json.loads(connection.recv(MESSAGE) or b"{}")
    except (OSError, ValueError) as exc:
        connection.close()
        return None, f"the spare did not answer ({exc})"
    finally:
        if null is not None:
            os.close(null)
    if "taken" not in answer:
        connection.close()
        return None, f"refused: {answer.get('refused', 'no answer')}"
    connection.settimeout(None)
    return Taken(int(answer["taken"]), connection), "taken"


def _umask() -> int:
    """This process's umask, read without setting it (a thread of the command may be creating a file)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            return next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o077)
        os.umask(mask)
        return mask


#: The key of the start message that carries a spare's environment (a new process gets it from ``exec``).
SPARE_ENV = "spare_env"


def wait_for_start(listen_fd: int) -> dict[str, Any]:
    """In the spare, its imports done: wait for the one taker, check that this process is the one a new process
    would be (refused: exit), take the taker's output, umask, niceness and environment, and return the start
    message (its report pipe's descriptor this process's)."""
    global _held
    listener = socket.socket(fileno=listen_fd)
    connection, _ = listener.accept()
    with contextlib.suppress(OSError):
        os.unlink(listener.getsockname())  # handed out once: nobody else connects
    listener.close()
    raw, fds, _flags, _address = socket.recv_fds(connection, MESSAGE, 3)
    message = json.loads(raw)
    start = read_start_word(message["word"])
    env = start.pop(SPARE_ENV)
    why = refusal(message, env) if len(fds) == 3 else "no report pipe"
    if why is not None:
        with contextlib.suppress(OSError):
            connection.send(json.dumps({"refused": why}).encode())
        os._exit(0)
    report_fd, out, err = fds
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.close(out)
    os.close(err)
    os.umask(int(message["umask"]))
    # where a new process would have started: ``python -m`` puts that folder first on sys.path
    if sys.path and sys.path[0] == os.getcwd():
        sys.path[0] = message["cwd"]
    os.chdir(message["cwd"])
    _take_environment(env)
    start["report_fd"] = report_fd
    connection.send(json.dumps({"taken": os.getpid()}).encode())
    _hang_up_with(connection)
    _held = connection
    return start


def refusal(message: Mapping[str, Any], env: Mapping[str, str]) -> str | None:
    """Why this spare is not the process a new one, started now by the taker with ``env``, would be (None: it
    is); at a niceness below its own, which it may not take, too."""
    bounds = process_bounds()
    if message["limits"] != bounds["limits"]:
        return "other data or address-space limits (ulimit -d, -v)"
    if message["cores"] != bounds["cores"]:
        return "other cores"
    # the interpreter makes PYTHONPATH's entries absolute from the folder it starts in: the spare's is another
    if any(not os.path.isabs(entry) for entry in env.get("PYTHONPATH", "/").split(os.pathsep)):
        return "a relative folder in PYTHONPATH"
    nice = int(message["nice"])
    if nice != os.getpriority(os.PRIO_PROCESS, 0):
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        except OSError:
            return f"a niceness of {nice}, below the spare's"
    return _shadowed(message["cwd"])


def _shadowed(cwd: str) -> str | None:
    """Whether a new process started in ``cwd`` (first on ``sys.path``, where the spare had an empty folder)
    would import another file than the spare did: an entry of the folder named as a module it imported."""
    try:
        entries = os.listdir(cwd)
    except OSError:
        return "its working folder cannot be read"
    for entry in entries:
        imported = sys.modules.get(entry.split(".", 1)[0])
        if imported is None:
            continue
        path = os.path.realpath(os.path.join(cwd, entry))
        if os.path.isdir(path):
            importable, inside = os.path.isfile(os.path.join(path, "__init__.py")), os.path.join(path, "")
        else:
            importable, inside = entry.endswith((".py", ".so")), path
        origin = os.path.realpath(getattr(imported, "__file__", None) or os.devnull)
        if importable and not origin.startswith(inside):
            return f"the working folder's {entry} would be imported in place of the module the spare imported"
    return None


def _take_environment(env: Mapping[str, str]) -> None:
    """This process's environment becomes ``env`` (as :func:`autobatch.probe.forked.take_environment`, without
    importing it into the measured process): what the script and torch read from now on is the job's."""
    import tempfile

    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None


def _hang_up_with(connection: socket.socket) -> None:
    """``SIGHUP`` to this process when the taker's end closes (the taker died, or it is done): as a new
    process's parent's death sends it (:func:`autobatch.probe.lineage.die_with_parent`)."""
    fd = connection.fileno()
    fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGHUP)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)
    try:  # closed before O_ASYNC was set: no signal comes
        gone = connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        gone = False
    if gone:
        os.kill(os.getpid(), signal.SIGHUP)
