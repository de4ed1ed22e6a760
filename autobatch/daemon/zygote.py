"""The warm process every request's command is forked from: torch and the whole command imported once.

The daemon starts it (``python -m autobatch.daemon.zygote FD``) before it serves, with one end of a
``SOCK_SEQPACKET`` pair (one message per packet: no framing of ours). It stays single-threaded and never
touches CUDA, so a fork of it is as safe as the probe server's forks. It also imports what a probe server
imports before its first fork, and starts with the CPU device's pinned allocator (``MALLOC_ENV``), so that a
command forked from it forks its probe server from itself (:mod:`autobatch.probe.forked`). For each request it
receives the request (argv, working folder, environment, ``sys.path``) and the request's stdout, stderr and
event pipes, forks, and answers ``{"started": id, "pid": pid}``; when a child exits it answers
``{"exited": pid, "code": code}`` (``-N`` for a signal N). The child takes a session of its own (its process group is its
pid, which the daemon signals to cancel it), dies with the zygote (``PR_SET_PDEATHSIG``), takes the client's
folder, environment, arguments and bounds (memory limits, umask, cores, niceness), and runs
:func:`autobatch.cli.main` as ``autobatch ARGS`` would.

A request of an environment whose probe servers warmed the script's libraries is passed to that environment's
warm parent (:mod:`autobatch.daemon.parents`), a fork of this process that imported them and runs the same loop
(:class:`_Forker`), so its command is forked there; the warm process relays the parent's answers. It tells the
daemon its warm parents as they change (``{"parents": [...]}``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autobatch.daemon.parents import Parents

#: Largest request message (the environment is the bulk of it); the server enforces a smaller limit.
MAX_MESSAGE = 4 << 20


def main(fd: int, kept: Path) -> None:
    """Serve the daemon on the control socket ``fd``; what the probe servers forked from here measure once for
    all of them is kept in ``kept`` (:func:`autobatch.probe.forked.keep_in`)."""
    control = socket.socket(fileno=fd)
    started_with = dict(os.environ)  # what the native libraries read as they load
    from autobatch.probe.server import lifelong_imports

    with lifelong_imports():  # then frozen: no command forked from here walks them in a collection of its own
        import torch  # noqa: F401  # warm: every command forked from here has it imported

        group = _warm()
    from autobatch.probe import forked

    forked.keep_in(kept)

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of `autobatch serve` is the daemon's to handle
    from autobatch.probe.lineage import die_with_parent

    die_with_parent(signal.SIGKILL)
    from autobatch.daemon.parents import Parents

    parents = Parents(
        kept.parent,
        serve=lambda channel: _Forker(channel, None, started_with).serve(),
        script_of=lambda argv: _script_of(group, argv),
    )
    control.send(json.dumps({"ready": True, "pid": os.getpid()}).encode())
    _Forker(control, parents, started_with).serve()


class _Forker:
    """The loop of a process commands are forked from: for each request on ``channel``, fork its command (or
    pass it to the warm parent of its environment, :mod:`autobatch.daemon.parents`), answer ``started`` and
    ``exited`` on the channel. The warm process runs it with its ``parents``; a warm parent, with None."""

    def __init__(self, channel: socket.socket, parents: Parents | None, started_with: dict[str, str]) -> None:
        self.channel, self.parents, self.started_with = channel, parents, started_with
        self.children: dict[int, dict[str, Any]] = {}
        self.woken, self.waking = _wake_on_child_exit()
        if parents is not None:
            parents.in_child = self.in_child

    def serve(self) -> None:
        """Until the channel closes (the daemon, or for a warm parent the warm process, is gone)."""
        while True:
            watched = [self.channel.fileno(), self.woken, *(self.parents.channels() if self.parents else [])]
            readable, _, _ = select.select(watched, [], [], 5.0)
            if self.woken in readable:
                while _drained(self.woken):
                    pass
            for answer in self.parents.heard(readable) if self.parents is not None else []:
                self._answer(answer)
            if self.channel.fileno() in readable and not self._take():
                return
            self._reap()
            if self.parents is not None and self.parents.changed():
                self._answer({"parents": self.parents.describe()})

    def in_child(self) -> None:
        """What a process forked from here closes first: this process's own descriptors and handlers."""
        self.channel.close()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.close(self.woken)
        os.close(self.waking)
        if self.parents is not None:
            self.parents.close()

    def _take(self) -> bool:
        """The next request: its command forked here or by a warm parent. False at the channel's end."""
        message, fds, _flags, _addr = socket.recv_fds(self.channel, MAX_MESSAGE, 3)
        if not message:
            return False
        request = json.loads(message)
        if not (self.parents is not None and self.parents.take(request, fds)):
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                self.in_child()
                _child(request, fds, self.started_with)
            self.children[pid] = request
            self._answer({"started": request["id"], "pid": pid})
        for each in fds:
            os.close(each)
        return True

    def _reap(self) -> None:
        """Answer ``exited`` for each command that ended (a warm parent's end: for the commands that died with
        it); a command that ended may have taught its environment's warm parent what to import."""
        from autobatch.probe.lineage import exited_children

        for pid, status in exited_children():
            request = self.children.pop(pid, None)
            if request is not None:
                self._answer({"exited": pid, "code": os.waitstatus_to_exitcode(status)})
                if self.parents is not None:
                    self.parents.learn(request)
            elif self.parents is not None:
                for answer in self.parents.ended(pid):
                    self._answer(answer)

    def _answer(self, answer: dict[str, Any]) -> None:
        self.channel.send(json.dumps(answer).encode())


def _wake_on_child_exit() -> tuple[int, int]:
    """A pipe (read end, write end) that a byte reaches when a child exits (``SIGCHLD`` through Python's
    wake-up fd): its exit code goes to the daemon at once, not at the next poll."""
    read, write = os.pipe()
    for end in (read, write):
        os.set_blocking(end, False)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)  # a handler, so that the signal is delivered
    signal.set_wakeup_fd(write)
    return read, write


def _drained(fd: int) -> bool:
    """Read what the wake-up pipe holds; False once it is empty."""
    try:
        return bool(os.read(fd, 4096))
    except BlockingIOError:
        return False


def _warm() -> Any:
    """Import what the routed commands use (ours and the libraries they import on first use), build the app's
    command and parse each routed command's options once (Typer builds its converters on the first parse): a
    fork inherits them all. The finalizers of what it imported do not run at each command's exit. Returns the
    app's command (its routed commands parse a request's arguments: :func:`_script_of`)."""
    import filelock  # noqa: F401

    import autobatch.cli.root  # every command module registered and imported
    import autobatch.core.world  # noqa: F401
    import autobatch.devices.inventory  # noqa: F401
    import autobatch.devices.selection  # noqa: F401
    import autobatch.probe.client  # noqa: F401
    import autobatch.run.check  # noqa: F401
    import autobatch.service.check  # noqa: F401
    import autobatch.service.tune  # noqa: F401
    from autobatch.daemon.client import ROUTED
    from autobatch.probe.ops import load_operations
    from autobatch.probe.server import preload

    load_operations(())  # what a probe server imports before its first fork, imported here once
    preload()
    group = autobatch.cli.root.command()
    for name in ROUTED:
        group.commands[name].make_context(name, [], resilient_parsing=True)  # type: ignore[attr-defined]
    # What the warm imports hold (torch's operator libraries, unregistered by finalizers) is left to each
    # command's os._exit, as a fresh process's exit leaves its own: not unregistered again by every command.
    for finalizer in getattr(weakref.finalize, "_registry", {}):
        finalizer.atexit = False
    return group


def _script_of(group: Any, argv: list[str]) -> list[Any]:
    """What a request's command names of its script, parsed as the command parses it: the script and the
    settings file (None each when it names none: ``./autobatch.toml``'s, then)."""
    try:
        params = group.commands[argv[0]].make_context(argv[0], list(argv[1:]), resilient_parsing=True).params
    except Exception:  # noqa: BLE001 - the command itself reports what is wrong with its arguments
        return [None, None]
    return [params.get("script"), params.get("config")]


def _take_limits(limits: dict[str, list[int]]) -> None:
    """Take on the client's resource limits (``RLIMIT_DATA``, ``RLIMIT_AS``: a job script's ``ulimit``), which
    the job started from its shell inherits and the probes must run under. Lowered only: a limit above the
    daemon's hard one stays at that (the daemon's is then what bounds the command, and its capacity says so)."""
    import resource

    from autobatch.devices.cpu import under_hard

    for name, (soft, hard) in limits.items():
        which = getattr(resource, name)
        _, own = resource.getrlimit(which)
        resource.setrlimit(which, (under_hard(soft, own), under_hard(hard, own)))


def _take_cores(cores: list[int] | None) -> None:
    """Run on the client's cores (a job's CPU binding, ``taskset``), those of them the daemon may use: what the
    command starts (a fresh probe server, the job's fresh process, ranks) starts a thread per core as the job
    does. A probe server forked from here keeps the warm process's threads, so the command's servers start as
    a fresh Python then (:func:`autobatch.probe.forked.why_cold`)."""
    if not cores:
        return
    allowed = os.sched_getaffinity(0)
    wanted = set(cores) & allowed
    if wanted and wanted != allowed:
        os.sched_setaffinity(0, wanted)


def _take_nice(nice: int | None) -> str | None:
    """Run at the client's niceness (a job script's ``nice -n 10``): the command's probes, and what it starts, get
    the share of a busy CPU its job's processes get. A niceness above the daemon's is always taken; one below it
    only where the daemon may lower its own (``CAP_SYS_NICE``, ``RLIMIT_NICE``): otherwise the command runs at the
    daemon's, and the note returned says so (docs/daemon.md says why it is not refused)."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    if nice is None or nice == own:
        return None
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except PermissionError:
        return (
            f"note: this command runs at the autobatch daemon's niceness {own}, not its own {nice} (the daemon may "
            f"not lower a command's): on a busy CPU its steps run slower than its job's will; to run at {nice} "
            f"through the daemon, stop it (autobatch daemon stop) and let a command at nice {nice} start it"
        )
    return None


def _child(request: dict[str, Any], fds: list[int], started_with: dict[str, str]) -> None:
    """Become the client's ``autobatch ARGS`` and exit with its code; never returns."""
    code = 1
    try:
        os.setsid()
        from autobatch.probe import forked

        # its probe servers are forked from it when their environment allows
        forked.enable(started_with, request.get("key", ""))
        _read_inventory_from(request.get("socket"))
        _spares_from(request.get("socket"), request["id"])
        from autobatch.devices.cgroup import CgroupMemory, for_job

        for_job(CgroupMemory(*request["cgroup"]) if request.get("cgroup") else None)  # the client's, not ours
        _take_limits(request.get("limits") or {})
        if request.get("umask") is not None:  # the client's: the files it writes get their in-process modes
            os.umask(request["umask"])
        _take_cores(request.get("cores"))
        note = _take_nice(request.get("nice"))
        from autobatch.probe.lineage import die_with_parent

        die_with_parent(signal.SIGKILL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for each in (stdin, fds[0], fds[1]):
            os.close(each)
        os.chdir(request["cwd"])
        forked.take_environment(request["env"])
        sys.path[:] = request["sys_path"]
        sys.argv = ["autobatch", *request["argv"]]
        from autobatch.cli.app import reset_console
        from autobatch.records import daemon_events as events

        events.attach(fds[2])
        reset_console()
        if note:
            print(note, file=sys.stderr, flush=True)
        code = _run()
    finally:
        os._exit(code)


def _read_inventory_from(socket_path: str | None) -> None:
    """The command reads NVML's facts from the daemon's reader (:func:`autobatch.devices.inventory.served_by`):
    NVML is not started again in every command."""
    if socket_path is None:
        return
    import functools

    from autobatch.daemon.client import served_facts
    from autobatch.devices.inventory import served_by

    served_by(functools.partial(served_facts, socket_path))


def _spares_from(socket_path: str | None, request: str) -> None:
    """The command's fresh-process measurement takes a spare the daemon started ahead, where one matches
    (:mod:`autobatch.probe.spare`)."""
    if socket_path is None:
        return
    import functools

    from autobatch.daemon.client import spare_for
    from autobatch.probe.spare import served_by

    served_by(functools.partial(spare_for, socket_path, request))


def _run() -> int:
    import atexit

    from autobatch.cli import main

    try:
        main()
        code: Any = 0
    except SystemExit as done:
        code = done.code
    except BaseException:  # what the interpreter would print on its way out
        import traceback

        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))
