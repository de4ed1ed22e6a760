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
folder, environment and arguments, and runs :func:`autobatch.cli.main` as ``autobatch ARGS`` would.
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
from typing import Any

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

        _warm()
    from autobatch.probe import forked

    forked.keep_in(kept)

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of `autobatch serve` is the daemon's to handle
    from autobatch.probe.lineage import die_with_parent

    die_with_parent(signal.SIGKILL)
    woken, waking = _wake_on_child_exit()
    control.send(json.dumps({"ready": True, "pid": os.getpid()}).encode())
    children: dict[int, str] = {}
    while True:
        readable, _, _ = select.select([control.fileno(), woken], [], [], 5.0)
        if woken in readable:
            while _drained(woken):
                pass
        if control.fileno() in readable:
            message, fds, _flags, _addr = socket.recv_fds(control, MAX_MESSAGE, 3)
            if not message:
                return  # the daemon is gone
            request = json.loads(message)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                control.close()
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.close(woken)
                os.close(waking)
                _child(request, fds, started_with)
            for each in fds:
                os.close(each)
            children[pid] = request["id"]
            control.send(json.dumps({"started": request["id"], "pid": pid}).encode())
        _reap(control, children)


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


def _warm() -> None:
    """Import what the routed commands use (ours and the libraries they import on first use), build the app's
    command and parse each routed command's options once (Typer builds its converters on the first parse): a
    fork inherits them all. The finalizers of what it imported do not run at each command's exit."""
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


def _reap(control: socket.socket, children: dict[int, str]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.pop(pid, None)
        control.send(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


def _child(request: dict[str, Any], fds: list[int], started_with: dict[str, str]) -> None:
    """Become the client's ``autobatch ARGS`` and exit with its code; never returns."""
    code = 1
    try:
        os.setsid()
        from autobatch.probe import forked

        forked.enable(started_with)  # its probe servers are forked from it when their environment allows
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
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = request["sys_path"]
        sys.argv = ["autobatch", *request["argv"]]
        from autobatch.cli.app import reset_console
        from autobatch.records import daemon_events as events

        events.attach(fds[2])
        reset_console()
        code = _run()
    finally:
        os._exit(code)


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
