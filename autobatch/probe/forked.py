"""A probe server forked from a warm process instead of started as a fresh Python: the daemon's warm path.

A command the daemon runs is a fork of its warm process, which imported torch, the probe operations and
autobatch once (:mod:`autobatch.daemon.zygote`, which calls :func:`enable`). Such a command starts its probe
server by forking itself and running :func:`autobatch.probe.server.main` in the child, so the server skips
its interpreter's start and torch's import. It does so only when the fork is what an exec'd server would be
(:func:`why_cold`; otherwise the server starts as a fresh Python, as in-process):

* what native libraries read once, when they load (glibc's malloc, OpenMP, the interpreter, torch's
  import-time settings: :func:`load_time_env`), is the same in the server's environment as in the warm
  process's start: the CPU device's pinned allocator (``MALLOC_ENV``) is among them, so the daemon starts
  its warm process with it;
* the command started no thread (a fork copies only the forking thread, with every lock another one held);
* no CUDA context exists in it, and it did not start CUDA's driver either (after which a forked child cannot
  initialise CUDA: :func:`autobatch.devices.cuda.runtime.fork_breaks_cuda`).

The child is made to look like an exec'd one: its own session, the pipes on 0 and 1 and the log on 2,
every other descriptor replaced by ``/dev/null`` (locks and pipes of the command released, and no number
freed for reuse under an object that still holds it), Python's signal handlers reset, the environment and
``sys.path`` of ``python -m`` (the working folder first).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from autobatch.devices.cpu import cores
from autobatch.probe.warming import Warming, thread_count, top_package

#: Prefixes of environment variables read once, when a library loads: a fork keeps what the warm process read.
LOAD_TIME = (
    "MALLOC_",
    "GLIBC_",
    "LD_",
    "OMP_",
    "GOMP_",
    "KMP_",
    "MKL_",
    "OPENBLAS_",
    "PYTHON",
    "TORCH",
    "PYTORCH_",
)


def take_environment(env: Mapping[str, str]) -> None:
    """Replace this process's environment with ``env`` (a request's, in a fork of the daemon's warm process or of
    a warm parent), and forget what Python worked out from the one before: the temporary folder, which
    :mod:`tempfile` reads from ``TMPDIR`` once and keeps. Kept, every temporary file of the command, its probes
    and its script went to the daemon's ``TMPDIR``: a job's folder that the scheduler removes when that job
    ends (the daemon outlives the job that started it), where the next job's script failed to create one."""
    import tempfile

    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None


#: The load-time environment the warm process started with (None: this process is not a warm one).
_warm: dict[str, str] | None = None
#: The threads this process ran when it was marked warm (a fork copies only the thread that forks).
_threads = 1
#: The cores the warm process could run on (:func:`autobatch.devices.cpu.cores`) when it imported torch.
_cores = 0


#: The warm parent this process descends from (:mod:`autobatch.daemon.parents`: its environment's key, the
#: modules it imported and under which warming), None: the warm process itself, or none.
_lineage: dict[str, Any] | None = None
#: The environment key of the request this command runs (set by the warm process as it forks it).
_request_key = ""
#: What a command keeps for its environment: the modules its probe server warmed (:func:`learn`).
LEARNED = "parent:"

#: The warm process's file (in the daemon's folder) of outcomes that hold for every probe server forked from it:
#: the forked half of the job's fresh-process offset (:func:`kept`). None: not a warm process, or none kept.
_kept_in: Path | None = None
#: The warm process the file belongs to: a file another warm process wrote is not read.
_kept_by = 0
#: Outcomes the file keeps at most (the oldest goes first).
KEPT_AT_MOST = 64


def keep_in(path: Path) -> None:
    """In the warm process, at its start: keep what its probe servers measure once in ``path``, emptied now.
    Its commands inherit the place; the daemon removes the file when it stops."""
    global _kept_in, _kept_by
    _kept_in, _kept_by = path, os.getpid()
    _write({})


def kept(key: str) -> dict[str, Any] | None:
    """The outcome a probe server forked from this warm process measured for ``key`` (None: none)."""
    return _read().get(key)


def keep(key: str, outcome: dict[str, Any]) -> None:
    """Keep ``outcome`` for ``key``, for the commands forked from this warm process after this one."""
    if _kept_in is None:
        return
    entries = _read()
    entries.pop(key, None)
    entries[key] = outcome
    while len(entries) > KEPT_AT_MOST:
        entries.pop(next(iter(entries)))
    _write(entries)


def _read() -> dict[str, Any]:
    if _kept_in is None:
        return {}
    try:
        data = json.loads(_kept_in.read_text())
    except (OSError, ValueError):
        return {}
    entries = data.get("kept") if isinstance(data, dict) and data.get("warm") == _kept_by else None
    return entries if isinstance(entries, dict) else {}


def _write(entries: dict[str, Any]) -> None:
    """Replace the file whole (two commands writing at once: one's entry is lost, and measured again)."""
    assert _kept_in is not None
    temporary = _kept_in.with_name(f".{_kept_in.name}.{os.getpid()}")
    try:
        temporary.write_text(json.dumps({"warm": _kept_by, "kept": entries}))
        os.replace(temporary, _kept_in)
    except OSError:
        temporary.unlink(missing_ok=True)


def load_time_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of ``env`` that libraries read when they load."""
    return {key: value for key, value in env.items() if key.startswith(LOAD_TIME)}


def enable(env: Mapping[str, str], request_key: str = "") -> None:
    """Mark this process (just forked from the warm one, started with ``env``, for a request of the environment
    ``request_key``) as one its probe servers may be forked from."""
    global _warm, _threads, _request_key, _cores
    _warm, _threads, _request_key, _cores = load_time_env(env), thread_count(), request_key, cores()


def descend(lineage: dict[str, Any]) -> None:
    """In a warm parent: what it imported (``key``, ``modules``, ``warming``), which its commands inherit."""
    global _lineage
    _lineage = dict(lineage)


def lineage() -> str:
    """Which warm process this one descends from, for what is kept per warm process: "" for the warm process
    itself, else its warm parent's environment, modules and warming."""
    return json.dumps(_lineage, sort_keys=True) if _lineage else ""


def learn(modules: list[str], warming: Warming) -> None:
    """Keep, for this command's environment, the modules its probe server warmed and its probes imported, and
    under which warming: the warm process starts a parent that imports them for the environment's next
    commands."""
    # of packages the warm process has not loaded: torch's own submodules, imported as it goes, are not worth a
    # parent (the warm process has torch); a parent's own packages are
    parents = {top_package(name) for name in (_lineage or {}).get("modules", [])}
    new = [name for name in modules if top_package(name) not in sys.modules or top_package(name) in parents]
    if _lineage is not None and Warming.from_dict(_lineage["warming"]).holds_no_more_than(warming):
        # the parent serves this command's budget: kept under its warm-up, so the warm process keeps it (a
        # smaller budget, whose server started cold, teaches it to replace the parent with one of that budget)
        warming = Warming.from_dict(_lineage["warming"])
    if _request_key and new:
        keep(LEARNED + _request_key, {"modules": new, "warming": warming.to_dict()})


def why_cold(env: Mapping[str, str], warming: Warming | None) -> str | None:
    """Why a probe server with environment ``env`` and warm-up ``warming`` cannot be forked from this process
    (None: it can; ``warming`` None: whatever the warm-up)."""
    if _warm is None:
        return "not a warm process"
    if warming is not None and _lineage is not None:
        imported = Warming.from_dict(_lineage["warming"])
        if not imported.holds_no_more_than(warming):
            shown = ", ".join(_lineage["modules"][:4]) + (" ..." if len(_lineage["modules"]) > 4 else "")
            return (
                f"its warm parent imported {shown} under a larger warm-up (its {imported.describe()}, this "
                f"server's {warming.describe()})"
            )
    wanted = load_time_env(env)
    if wanted != _warm:
        keys = sorted(k for k in wanted.keys() | _warm.keys() if wanted.get(k) != _warm.get(k))
        return f"the load-time environment differs from the warm process's ({', '.join(keys)})"
    if cores() != _cores:
        return (
            f"it may run on {cores()} core(s), the warm process on {_cores}: torch's threads, one per core, were "
            "counted as the warm process imported it"
        )
    if thread_count() > _threads:
        return f"the command started {thread_count() - _threads} thread(s)"
    from autobatch.devices.cuda.runtime import fork_breaks_cuda

    if (why := fork_breaks_cuda()) is not None:
        return f"the command {why}"
    return None


class ForkedServer:
    """The forked server, as :class:`autobatch.probe.client.ProbeClient` uses a ``subprocess.Popen``."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(["autobatch.probe.server"], timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode


def start(init: str, env: Mapping[str, str], stderr: IO[bytes]) -> ForkedServer:
    """Fork the probe server (its init message ``init``, environment ``env``, log ``stderr``)."""
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    stderr.flush()
    pid = os.fork()
    if pid == 0:
        _become_server(init, env, stdin_r, stdout_w, stderr.fileno())
    os.close(stdin_r)
    os.close(stdout_w)
    return ForkedServer(pid, os.fdopen(stdin_w, "wb"), os.fdopen(stdout_r, "rb"))


def _become_server(init: str, env: Mapping[str, str], stdin: int, stdout: int, stderr: int) -> None:
    """In the forked child: become ``python -m autobatch.probe.server INIT`` and exit; never returns."""
    code: Any = 1
    try:
        os.setsid()  # as start_new_session: the server's group is its own
        os.dup2(stdin, 0)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        _release_descriptors()
        _reset_signals()
        os.environ.clear()
        os.environ.update(env)
        if sys.path and not env.get("PYTHONSAFEPATH"):
            sys.path[0] = os.getcwd()  # what ``python -m`` puts first
        sys.argv = [sys.argv[0], init]
        from autobatch.probe import server

        server.main()
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # noqa: BLE001 - what the interpreter would print on its way out
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _release_descriptors() -> None:
    """Replace every descriptor above 2 with ``/dev/null``: what they held (a lock, a pipe) is released, and
    their numbers stay taken, so an object of the command that still holds one never closes a reused one."""
    null = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != null:
            try:
                os.dup2(null, fd)
            except OSError:
                pass  # the listing's own descriptor, closed by now
    os.close(null)


def _reset_signals() -> None:
    """Python's handlers of the command back to the defaults an exec'd interpreter starts with."""
    signal.setitimer(signal.ITIMER_REAL, 0)
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            handler = signal.getsignal(signum)
        except (ValueError, OSError):
            continue
        if callable(handler) and signum != signal.SIGINT:
            signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
