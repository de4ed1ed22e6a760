"""The daemon's spare fresh process: the job's fresh process of the last request, started again ahead.

Before a tune's first probe, the job's fresh process is measured: a new ``python`` that imports torch and the
script and runs a few steps (:mod:`autobatch.probe.fresh`); through the daemon it runs before the first probe,
and torch's import is most of its 3 s. When a request's command asked for a spare (:mod:`autobatch.probe.spare`),
the daemon starts one for its key once that command has ended: a new ``python -m autobatch.probe.fresh --spare``
with the environment, limits and cores the command's fresh process had, in an empty folder, which imports
torch and waits. The next request of the same key takes it; one of another key does not (it starts a new process, as
without the daemon), and its own spare replaces this one. Spares start only where they would be the process a
new one is: limits and cores the daemon's own (it cannot start one under others), a niceness at or above the
daemon's. One at most (:data:`AT_MOST`: each holds a Python with torch, about 150 MiB of its own); all of them
end with the daemon (asked to, then killed), a taken one with its taker too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autobatch.daemon.parents import JOB_IDENTITY
from autobatch.probe.spare import ANSWER_WAIT, OWN_VARIABLES, SPARE_FLAG, process_bounds

#: Spares waiting at most.
AT_MOST = 1
#: Seconds a spare asked to end (SIGHUP: it ends what it started) gets before SIGKILL.
END_GRACE = 3.0


def spare_key(asked: Mapping[str, Any]) -> str:
    """What a spare shares with a new fresh process (:func:`autobatch.probe.spare.asked`): the environment but
    what a shell sets per command, what a scheduler sets to name the job, autobatch's own variables and ``PWD``
    (a probe server's scratch folder, new in every run; the interpreter reads its folder from the kernel): none
    is read before the script. The limits and cores, the interpreter and its site folders' last change (a
    package installed or removed). Not the working folder: a spare starts in an empty one, and takes the
    taker's where nothing in it shadows what it imported (:func:`autobatch.probe.spare.refusal`)."""
    from autobatch.cache.fresh import interpreter
    from autobatch.cache.keys import digest
    from autobatch.probe.client import steady_environment

    env = [
        (k, v)
        for k, v in steady_environment(asked["env"])
        if k != "PWD" and not k.startswith((*JOB_IDENTITY, *OWN_VARIABLES))
    ]
    return digest([env, asked["limits"], asked["cores"], interpreter()], length=32)


def malformed(body: Any) -> str | None:
    """What is wrong with a spare's request (``POST /v1/spare``: the request's id, and
    :func:`autobatch.probe.spare.asked`); None: nothing."""
    fields = {"request": str, "env": dict, "cwd": str, "nice": int, "limits": list, "cores": list}
    if (
        isinstance(body, dict)
        and set(body) == set(fields)
        and all(isinstance(body[k], t) for k, t in fields.items())
    ):
        return None
    return "malformed spare request; expected an object of " + ", ".join(fields)


def startable(asked: Mapping[str, Any]) -> bool:
    """Whether the daemon can start a spare that is the process ``asked`` describes: under its own limits and
    cores (what libraries read as they load), at a niceness it may take."""
    bounds = process_bounds()
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    return bool(
        asked["limits"] == bounds["limits"] and asked["cores"] == bounds["cores"] and asked["nice"] >= nice
    )


@dataclass
class Spare:
    key: str
    path: Path
    process: subprocess.Popen[bytes]
    cwd: str
    since: float = field(default_factory=time.time)
    #: When it was handed out (``time.monotonic()``); None: waiting.
    taken_at: float | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "pid": self.process.pid,
            "cwd": self.cwd[-120:],
            "since": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.since)),
        }


class Spares:
    """The spares waiting (by key), those taken and still running, and what each running request asked for."""

    def __init__(self, folder: Path, log: Any) -> None:
        self.folder, self.log = folder, log
        #: Where spares start: an empty folder (first on their sys.path until a taker's takes its place).
        self.empty = folder / "spare"
        self.waiting: dict[str, Spare] = {}
        self.taken: list[Spare] = []
        self.wanted: dict[str, dict[str, Any]] = {}  # request id -> what its fresh process started with
        self.lock = threading.Lock()
        self.closed = False
        self._starts: list[dict[str, Any]] = []
        self._wake = threading.Condition(self.lock)
        # spares die with the thread that started them (PR_SET_PDEATHSIG is a thread's): one for the daemon's life
        threading.Thread(target=self._starter, name="spare starter", daemon=True).start()

    def ask(self, request: str, asked: dict[str, Any]) -> str | None:
        """The socket of a spare of ``asked``'s key for request ``request`` (None: none), handed out once; a spare
        of that key is started once the request ends."""
        key = spare_key(asked)
        with self.lock:
            if self.closed:
                return None
            self.wanted[request] = {**asked, "key": key}
            spare = self.waiting.pop(key, None)
            if spare is None:
                return None
            spare.taken_at = time.monotonic()
            self.taken.append(spare)
        self.log(f"{request}: the job's fresh process measured by spare {spare.process.pid}")
        return str(spare.path)

    def ended(self, request: str) -> None:
        """Request ``request`` ended: the spare it asked for is started (another key's waiting one ends)."""
        with self.lock:
            asked = self.wanted.pop(request, None)
            if asked is None or self.closed or asked["key"] in self.waiting:
                return
            if not startable(asked):
                self.log(
                    f"{request}: no spare fresh process (its limits, cores or niceness are not the daemon's)"
                )
                return
            self._starts.append(asked)
            self._wake.notify()

    def _starter(self) -> None:
        while True:
            with self.lock:
                while not self._starts and not self.closed:
                    self._wake.wait()
                if self.closed:
                    return
                asked = self._starts.pop(0)
                if asked["key"] in self.waiting:
                    continue
                while len(self.waiting) >= AT_MOST:
                    _, old = self.waiting.popitem()
                    threading.Thread(target=_end, args=(old,), daemon=True).start()
            spare = self._start(asked)
            with self.lock:
                if spare is not None and not self.closed:
                    self.waiting[spare.key] = spare
                elif spare is not None:
                    _end(spare)

    def _start(self, asked: dict[str, Any]) -> Spare | None:
        path = self.folder / f"spare-{asked['key'][:12]}.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.empty.mkdir(mode=0o700, exist_ok=True)
            path.unlink(missing_ok=True)
            listener.bind(str(path))
            listener.listen(1)
            process = subprocess.Popen(
                [sys.executable, "-m", "autobatch.probe.fresh", SPARE_FLAG, str(listener.fileno())],
                pass_fds=(listener.fileno(),),
                cwd=self.empty,
                env=asked["env"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            self.log(f"a spare fresh process did not start ({exc})")
            path.unlink(missing_ok=True)
            return None
        finally:
            listener.close()  # the spare holds it
        self.log(f"spare fresh process {process.pid} started")
        return Spare(asked["key"], path, process, asked["cwd"])

    def reap(self) -> None:
        """Forget the spares that ended (a waiting one that died: its socket removed); end one handed out that its
        taker never reached."""
        with self.lock:
            for key, spare in list(self.waiting.items()):
                if spare.process.poll() is not None:
                    del self.waiting[key]
                    spare.path.unlink(missing_ok=True)
                    self.log(
                        f"spare fresh process {spare.process.pid} ended (exit code {spare.process.returncode})"
                    )
            self.taken = [s for s in self.taken if s.process.poll() is None]
            # handed out, never connected to (its socket is removed as it accepts): its taker is gone
            lost = [
                s
                for s in self.taken
                if s.path.exists() and time.monotonic() - (s.taken_at or 0) > 2 * ANSWER_WAIT
            ]
            self.taken = [s for s in self.taken if s not in lost]
        for spare in lost:
            threading.Thread(target=_end, args=(spare,), daemon=True).start()

    def describe(self) -> list[dict[str, Any]]:
        with self.lock:
            return [spare.describe() for spare in self.waiting.values()]

    def close(self) -> None:
        """End every spare, waiting or taken, and wait for them."""
        with self.lock:
            self.closed = True
            every = [*self.waiting.values(), *self.taken]
            self.waiting, self.taken = {}, []
            self._wake.notify()
        for spare in every:
            _end(spare)


def _end(spare: Spare) -> None:
    """SIGHUP (a spare ends what its script started, as a fresh process does when its parent dies), then SIGKILL."""
    with contextlib.suppress(OSError):
        spare.process.send_signal(signal.SIGHUP)
    try:
        spare.process.wait(END_GRACE)
    except subprocess.TimeoutExpired:
        spare.process.kill()
        spare.process.wait()
    spare.path.unlink(missing_ok=True)
