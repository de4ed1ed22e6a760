"""Warm parents: the script's third-party imports kept warm between the daemon's requests.

A probe server imports the step's third-party modules before its first fork (``transformers`` and its
``Trainer``, ``lightning``: :mod:`autobatch.probe.warming`), 1-3 s each command. The warm process
(:mod:`autobatch.daemon.zygote`) keeps what a command's server warmed, per environment: once a command ends
whose server was forked and warmed modules, the warm process forks a *warm parent* that imports them as that
server did (the request's working folder, environment and ``sys.path``; under the same :class:`Warming`: on the
CPU the budget's soft data limit, which decides what a library reserves as it loads), then serves as the warm
process does: the next commands of that environment and script are forked from it, and their probe servers
find the modules imported. What the probes import themselves as the script runs (a library's lazy imports)
is imported there too (:func:`autobatch.probe.forked.learn`). The rules of a fork hold there too: a parent whose imports started a thread its library does
not make fork-safe, or after which a forked child could not use CUDA (a CUDA context, or CUDA's driver started by
``torch.cuda.is_available()``), refuses (and is not tried again for those modules).

The key is a fingerprint (:func:`environment_key`): the script and settings file the request's arguments name
(parsed as its command parses them: another script of the same folder, whose server would warm other modules
under another budget, keeps the warm process's path), the working folder, ``sys.path``, the environment's
variables but a shell's per-command ones and a scheduler's job's name and id, and the interpreter's site folders' last change (a package installed
or removed changes its folder). A parent is used only while every module file it imported is as it was (an
editable install's source edited: a new parent, never stale code). A command whose budget is smaller than
the one the parent imported under starts its server as a fresh Python (:func:`autobatch.probe.forked.why_cold`),
and the parent is replaced after it by one of that budget; a larger one forks from the parent. At most :data:`AT_MOST` parents live; the least recently used idle one
goes first. A parent dies with the warm process, and its commands with it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autobatch.probe import forked
from autobatch.probe.warming import top_package

#: Warm parents at most (each holds a Python with torch and its modules: a few hundred MiB).
AT_MOST = 4
#: Largest message a parent sends.
MESSAGE = 1 << 16


#: Prefixes of the variables a batch scheduler sets to name the job (its id, its nodes, its tasks, its start):
#: new in every job, read as the job runs, not as a library loads. They are left out of a parent's key, so that
#: the next job's commands of the same script and environment are forked from the parent the last one left
#: (with their own values: a command takes its client's whole environment). ``TMPDIR`` stays in the key: a
#: library may keep a path under it as it loads, and a job's folder goes with the job.
JOB_IDENTITY = ("SLURM_", "SLURMD_", "PBS_", "LSB_", "LSF_", "SGE_", "FLUX_")


def environment_key(request: dict[str, Any], script: list[Any]) -> str:
    """The fingerprint of a request's environment and ``script`` (what its arguments name of it: the script,
    the settings file): its working folder, ``sys.path``, the environment but what a shell sets per command
    and what a scheduler sets to name the job (:data:`JOB_IDENTITY`), and the interpreter's site folders' last
    change (a package installed or removed). What a parent imported is checked file by file besides
    (:meth:`Parent.fresh`)."""
    from autobatch.cache.fresh import interpreter
    from autobatch.cache.keys import digest
    from autobatch.probe.client import steady_environment

    env = [(k, v) for k, v in steady_environment(request["env"]) if not k.startswith(JOB_IDENTITY)]
    return digest([script, request["cwd"], request["sys_path"], env, interpreter()], length=32)


@dataclass
class Parent:
    """A warm parent, as the warm process knows it."""

    key: str
    pid: int
    channel: socket.socket
    modules: list[str]
    warming: dict[str, Any]
    cwd: str
    files_path: Path
    since: float = field(default_factory=time.time)
    ready: bool = False
    retiring: bool = False
    #: Module file -> (size, last change) as the parent imported it.
    files: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: The commands forked from it that still run: pid -> their request.
    running: dict[int, dict[str, Any]] = field(default_factory=dict)
    served: int = 0
    used: float = field(default_factory=time.monotonic)

    def fresh(self) -> bool:
        """Whether every module file it imported is as it was."""
        for path, then in self.files.items():
            try:
                info = os.stat(path)
            except OSError:
                return False
            if (info.st_size, info.st_mtime_ns) != tuple(then):
                return False
        return True

    def describe(self) -> dict[str, Any]:
        tops = list(dict.fromkeys(top_package(name) for name in self.modules))
        return {
            "pid": self.pid,
            "cwd": self.cwd[-120:],
            "modules": tops[:8],
            "data_limit": self.warming.get("data_limit"),
            "state": "retiring" if self.retiring else ("ready" if self.ready else "importing"),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.since)),
            "served": self.served,
        }


class Parents:
    """The warm process's warm parents: which to fork a request's command from, what they say, when to start,
    replace and end them. ``folder``: where a starting parent writes its module files; ``serve``: the warm
    process's loop, which a parent runs on its channel; ``script_of``: what a request's arguments name of its
    script (the script, the settings file), parsed as its command parses them."""

    def __init__(
        self,
        folder: Path,
        serve: Callable[[socket.socket], None],
        script_of: Callable[[list[str]], list[Any]],
    ) -> None:
        self.folder = folder
        self.serve = serve
        self.script_of = script_of
        #: What a process forked from the warm process closes first (set by its loop).
        self.in_child: Callable[[], None] = lambda: None
        self.by_key: dict[str, Parent] = {}
        self.by_pid: dict[int, Parent] = {}
        #: (key, modules, warming) a parent refused: not tried again.
        self.refused: set[str] = set()
        #: Modules whose import started a thread in a parent: never imported by one again.
        self.unsafe: set[str] = set()
        #: Requests forwarded to a parent, not yet started: id -> (parent, request).
        self.forwarded: dict[str, tuple[Parent, dict[str, Any]]] = {}
        self.described: list[dict[str, Any]] = []

    # -- routing --------------------------------------------------------------------------------------------

    def channels(self) -> list[int]:
        return [parent.channel.fileno() for parent in self.by_pid.values()]

    def take(self, request: dict[str, Any], fds: list[int]) -> bool:
        """Key ``request`` by its environment and pass it to that environment's parent; False: the warm process
        forks its command."""
        request["key"] = environment_key(request, self.script_of(list(request["argv"])))
        parent = self.route(request)
        return parent is not None and self.forward(parent, request, fds)

    def close(self) -> None:
        """In a process forked from the warm process: the parents' channels closed."""
        for parent in self.by_pid.values():
            parent.channel.close()

    def route(self, request: dict[str, Any]) -> Parent | None:
        """The ready parent of the request's environment whose imports are as they were (None: the warm
        process forks the command itself)."""
        parent = self.by_key.get(request["key"])
        if parent is None or not parent.ready or parent.retiring:
            return None
        if not parent.fresh():
            self._retire(parent)
            return None
        return parent

    def forward(self, parent: Parent, request: dict[str, Any], fds: list[int]) -> bool:
        """Send ``request`` to ``parent`` to fork; False when it cannot be reached (the warm process forks)."""
        try:
            socket.send_fds(parent.channel, [json.dumps(request).encode()], fds)
        except OSError:
            self._retire(parent)
            return False
        self.forwarded[request["id"]] = (parent, request)
        parent.served += 1
        parent.used = time.monotonic()
        return True

    # -- what parents say -------------------------------------------------------------------------------------

    def heard(self, readable: list[int]) -> list[dict[str, Any]]:
        """What the parents whose channels are ``readable`` said that goes on to the daemon."""
        channels = set(self.channels())
        return [answer for fd in readable if fd in channels for answer in self.hear(fd)]

    def changed(self) -> bool:
        """Whether the parents' description changed since the last call (the daemon's status shows it)."""
        now = self.describe()
        if now == self.described:
            return False
        self.described = now
        return True

    def hear(self, fd: int) -> Iterator[dict[str, Any]]:
        """Read a parent's message; yields what goes on to the daemon (a command started or exited)."""
        parent = next((p for p in self.by_pid.values() if p.channel.fileno() == fd), None)
        if parent is None:
            return
        try:
            message = parent.channel.recv(MESSAGE)
        except OSError:
            message = b""
        if not message:
            # it died (its exit is reaped); before it was ready, its imports failed: not tried again
            if not parent.ready:
                self.refused.add(_identity(parent.key, parent.modules, parent.warming))
            self._retire(parent)
            return
        answer = json.loads(message)
        if "ready" in answer:
            self._ready(parent, answer)
        elif "refused" in answer:
            self._log(f"a warm parent for {parent.cwd} refused: {answer['refused']}")
            if answer.get("culprit"):
                self.unsafe.add(answer["culprit"])  # the next parent imports the others
            else:
                self.refused.add(_identity(parent.key, parent.modules, parent.warming))
            self._retire(parent)
        elif "started" in answer:
            _, request = self.forwarded.pop(answer["started"], (parent, {}))
            parent.running[int(answer["pid"])] = request
            yield answer
        elif "exited" in answer:
            request = parent.running.pop(int(answer["exited"]), {})
            yield answer
            if request:
                self.learn(request)
            if parent.retiring and not parent.running:
                self._end(parent)

    def _ready(self, parent: Parent, answer: dict[str, Any]) -> None:
        try:
            files = json.loads(parent.files_path.read_text())
        except (OSError, ValueError):
            self._retire(parent)
            return
        finally:
            parent.files_path.unlink(missing_ok=True)
        parent.files = {path: (int(size), int(changed)) for path, size, changed in files}
        parent.ready = True
        imported = list(answer.get("imported", []))
        shown = ", ".join(imported[:6]) + (f" and {len(imported) - 6} more" if len(imported) > 6 else "")
        self._log(
            f"warm parent {parent.pid} for {parent.cwd}: {shown} imported in {answer.get('seconds', 0):.1f} s"
        )

    def ended(self, pid: int) -> Iterator[dict[str, Any]]:
        """A reaped child of the warm process that was a parent: the exits of the commands that died with it."""
        parent = self.by_pid.pop(pid, None)
        if parent is None:
            return
        if self.by_key.get(parent.key) is parent:
            del self.by_key[parent.key]
        parent.channel.close()
        parent.files_path.unlink(missing_ok=True)
        for request_id, (owner, _request) in list(self.forwarded.items()):
            if owner is parent:  # never started: the daemon hears the command failed to start
                del self.forwarded[request_id]
        if parent.running:
            self._log(f"warm parent {pid} ended: its {len(parent.running)} command(s) died with it")
        for command in parent.running:
            yield {"exited": command, "code": -signal.SIGKILL}

    # -- starting and ending ---------------------------------------------------------------------------------

    def learn(self, request: dict[str, Any]) -> None:
        """After a command of ``request`` ended: start (or replace) its environment's parent with the modules its
        probe server warmed, when it kept them (:func:`autobatch.probe.forked.learn`): with the parent's own too
        when they were imported under the same warm-up, so scripts of one folder taking turns do not replace
        each other's."""
        learned = forked.kept(forked.LEARNED + request["key"])
        if not learned or not learned.get("modules"):
            return
        modules = [name for name in learned["modules"] if name not in self.unsafe]
        warming = dict(learned.get("warming") or {})
        now = self.by_key.get(request["key"])
        if now is not None and not now.retiring and now.warming == warming:
            # the union: scripts of one folder taking turns keep each other's
            if set(modules) <= set(now.modules) and (not now.ready or now.fresh()):
                return
            modules = [*now.modules, *(name for name in modules if name not in now.modules)]
        if _identity(request["key"], modules, warming) in self.refused:
            return
        if now is not None and not now.retiring:
            self._retire(now)
        if not self._room():
            return
        self._start(request, modules, warming)

    def _room(self) -> bool:
        live = [p for p in self.by_pid.values() if not p.retiring]
        while len(live) >= AT_MOST:
            idle = [p for p in live if not p.running]
            if not idle:
                return False
            oldest = min(idle, key=lambda p: p.used)
            self._retire(oldest)
            live.remove(oldest)
        return True

    def _start(self, request: dict[str, Any], modules: list[str], warming: dict[str, Any]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        files_path = self.folder / f".parent-{request['key'][:12]}-{time.monotonic_ns()}.json"
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            ours.close()
            self.in_child()
            _become_parent(theirs, request, modules, warming, files_path, self.serve)
        theirs.close()
        parent = Parent(request["key"], pid, ours, modules, warming, request["cwd"], files_path)
        self.by_key[parent.key] = parent
        self.by_pid[pid] = parent

    def _retire(self, parent: Parent) -> None:
        """No new command for ``parent``; ended now when it runs none, else after its last."""
        parent.retiring = True
        if self.by_key.get(parent.key) is parent:
            del self.by_key[parent.key]
        if not parent.running:
            self._end(parent)

    def _end(self, parent: Parent) -> None:
        try:
            os.kill(parent.pid, signal.SIGKILL)  # it holds nothing of anyone's: reaped by the warm process
        except ProcessLookupError:
            pass

    def describe(self) -> list[dict[str, Any]]:
        return [parent.describe() for parent in self.by_pid.values()]

    def _log(self, line: str) -> None:
        print(f"autobatch daemon: {line}", file=sys.stderr, flush=True)


def _identity(key: str, modules: list[str], warming: dict[str, Any]) -> str:
    return json.dumps([key, modules, warming], sort_keys=True)


def _become_parent(
    channel: socket.socket,
    request: dict[str, Any],
    modules: list[str],
    warming: dict[str, Any],
    files_path: Path,
    serve: Callable[[socket.socket], None],
) -> None:
    """In the child forked from the warm process: import ``modules`` as the request's probe server did, say so
    (the module files it imported written to ``files_path``), then serve as the warm process does; never
    returns."""
    code = 0
    try:
        from autobatch.probe.lineage import die_with_parent

        die_with_parent(signal.SIGKILL)
        started = time.perf_counter()
        imported, files, why, culprit = _import(request, modules, warming)
        if why is not None:
            channel.send(json.dumps({"refused": why, "culprit": culprit}).encode())
            return
        files_path.write_text(json.dumps(files))
        seconds = time.perf_counter() - started
        channel.send(json.dumps({"ready": True, "imported": imported, "seconds": seconds}).encode())
        serve(channel)
    except BaseException:  # noqa: BLE001 - a parent that fails is one the warm process does without
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def _import(
    request: dict[str, Any], modules: list[str], warming: dict[str, Any]
) -> tuple[list[str], list[tuple[str, int, int]], str | None, str | None]:
    """Import ``modules`` in the request's folder, environment and ``sys.path``, under ``warming``: (the names
    imported, each module file it imported with its size and last change, why it cannot serve or None, the
    module whose import started a thread or None)."""
    from autobatch.devices.cuda.runtime import fork_breaks_cuda
    from autobatch.probe.server import lifelong_imports
    from autobatch.probe.warming import Warming, loaded_since, thread_count, warm

    before = frozenset(sys.modules)
    os.chdir(request["cwd"])
    forked.take_environment(request["env"])
    sys.path[:] = [request["cwd"], *request["sys_path"][1:]]  # a probe server's: the working folder first
    limits = Warming.from_dict(warming)
    imported: list[str] = []
    with lifelong_imports(), limits.importing():
        for name in modules:  # one at a time: the one that starts a thread is named, and left out next time
            imported += warm([name])
            threads = thread_count(limits.fork_safe)
            if threads > 1:
                return imported, [], f"importing {name} started {threads - 1} thread(s)", name
    if (why := fork_breaks_cuda()) is not None:
        return imported, [], f"after importing {', '.join(imported)} this process {why}", None
    forked.descend({"key": request["key"], "modules": modules, "warming": warming})
    files = []
    for path in loaded_since(before).values():
        try:
            info = os.stat(path)
        except OSError:
            continue
        files.append((path, info.st_size, info.st_mtime_ns))
    return imported, files, None, None
