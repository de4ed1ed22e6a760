"""How the probe layer's processes end, and everything the user's script starts with them.

A script may start processes of its own (a forked prefetcher, a ``DataLoader`` worker, a log shipper in a
session of its own, a double-forked watchdog); none may outlive its probe, nor decide when a probe's report
is read. :func:`read_until_exit` reads a report until the process exits, not until end of file;
:func:`become_subreaper` and :func:`end_descendants` make the probe server own and end every process a probe
started. Linux only (``prctl``, pidfds); elsewhere the prctl calls are no-ops and the reader polls ``waitpid``.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable, Iterator
from types import FrameType

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
#: Seconds between checks that a process has exited, where the kernel offers no pidfd to wait on.
POLL = 0.05
#: Seconds :func:`end_descendants` keeps killing and reaping before it gives up on a process.
END_GRACE = 5.0


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) while a process is started and its handle kept: a ``KeyboardInterrupt`` raised
    between the fork and the assignment leaves a process nobody stops (an interrupted notebook cell left its
    probe server running beside it). The interrupt is raised as the block ends, where the caller's cleanup
    knows the process. Python runs signal handlers in the main thread only: elsewhere nothing is held."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, FrameType | None]] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(*caught[0])
            elif previous == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)


def _prctl(option: int, value: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: no-op
        pass


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``sig`` to this process when its parent exits (no-op elsewhere)."""
    _prctl(PR_SET_PDEATHSIG, sig)


def become_subreaper() -> None:
    """Make this process the one its descendants' orphans are reparented to (no-op elsewhere)."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def end_descendants(grace: float = END_GRACE, spare: int | None = None) -> None:
    """SIGKILL every process below this one and reap the ones reparented here, until none is left (or ``grace``
    seconds passed). A process forked while its parent is killed is reparented to this subreaper and caught by
    the next round. ``spare``: a child of this process left running, with what is below it (the probe server's
    compiler, which ends what its own probes start).

    The probe server is the subreaper of its probes' descendants (:func:`become_subreaper`): a process whose
    parent exits is reparented to the server, not to init, whatever session or process group it moved to, so the
    server's tree holds every process a probe started. After each probe, and when the server is told to stop
    (SIGTERM, sent by the client, or by the kernel when the client dies: ``die_with_parent(SIGTERM)``), this kills
    that whole tree. The server and every probe share one session and process group (the client starts the
    server with ``start_new_session``): what was not moved out of it is also ended by the client's ``killpg``,
    the backstop for a server that no longer answers.
    """
    import psutil

    me = psutil.Process()
    deadline = time.monotonic() + grace
    while True:
        spared = _tree(spare)
        try:
            left = [p for p in me.children(recursive=True) if _running(p) and p.pid not in spared]
        except psutil.Error:
            left = []
        for process in left:
            try:
                process.kill()
            except psutil.Error:
                pass
        _reap_children()
        if not left or time.monotonic() > deadline:
            return
        time.sleep(0.005)


def end_script_descendants() -> None:
    """:func:`end_descendants` in a process that ran the user's script, once it has reported: the script's
    ``SIGCHLD`` handler is put back to the default first (a ``DataLoader``'s raises as its workers are killed,
    and the error reached the script's loop, which reported a second time)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    end_descendants()


def _tree(pid: int | None) -> set[int]:
    """The pids of the running process ``pid`` and of every process below it (none for None or one gone)."""
    import psutil

    if pid is None:
        return set()
    try:
        top = psutil.Process(pid)
        return {pid, *(p.pid for p in top.children(recursive=True))} if _running(top) else set()
    except psutil.Error:
        return set()


def end_tree(pid: int) -> None:
    """SIGKILL the process ``pid`` and every process below it, reaping none of them: for the job's fresh
    processes, which the command starts itself, outside the probe server's reach. Each is a subreaper
    (:func:`become_subreaper`), so what the script started is below it whatever it did; the tree is stopped
    first (SIGSTOP) until no new process shows, so that none forks away while it is killed."""
    import psutil

    try:
        top = psutil.Process(pid)
    except psutil.Error:
        return
    tree: list[psutil.Process] = []
    while True:
        try:
            now = [top, *top.children(recursive=True)]
        except psutil.Error:
            now = [top]
        for process in now:
            with contextlib.suppress(psutil.Error):
                process.suspend()
        if {p.pid for p in now} == {p.pid for p in tree}:
            break
        tree = now
    for process in tree:
        with contextlib.suppress(psutil.Error):
            process.kill()


def group_running(group: int) -> bool:
    """Whether a process of the process group ``group`` still runs (a zombie, dead but not yet reaped, does
    not: its memory and files are gone)."""
    import psutil

    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == group and _running(process):
                return True
        except OSError:
            continue
    return False


def _running(process: object) -> bool:
    import psutil

    assert isinstance(process, psutil.Process)
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _reap_children() -> None:
    """Collect every child of this process that has exited (the zombies reparented to it included)."""
    for _ in exited_children():
        pass


def exited_children() -> Iterator[tuple[int, int]]:
    """(pid, wait status) of each child of this process that has exited, collected as they are yielded."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status


#: The signals that end a probe server or a fresh process: its client's stop, its parent's death.
ENDING = (signal.SIGTERM, signal.SIGHUP)


def end_descendants_on(signum: int, then: Callable[[], None] | None = None) -> None:
    """On ``signum``, end every process below this one, call ``then``, and exit (status 128 + ``signum``): how
    the probe server and the job's fresh processes stop.

    Once: a parent that dies with several threads signals its child once per thread (the child is passed to
    each next thread on the way, and ``PR_SET_PDEATHSIG`` fires each time). A second signal must neither
    interrupt the first one's work nor find psutil half-imported by it, which raised and left the processes
    below, and the folders, behind."""
    import psutil  # noqa: F401  (imported now, not in the handler)

    def stop(received: int, frame: FrameType | None) -> None:
        for ending in ENDING:
            signal.signal(ending, signal.SIG_IGN)
        try:
            end_descendants()
            if then is not None:
                then()
        finally:
            os._exit(128 + received)

    signal.signal(signum, stop)


def has_exited(pid: int) -> bool:
    """Whether the child ``pid`` has exited (or was reaped already); it is left for its parent to reap."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def read_until_exit(fd: int, pid: int, deadline: float | None) -> tuple[bytes, int | None]:
    """What child ``pid`` wrote on the pipe ``fd`` until it exited: ``(bytes, wait status)``, the child reaped;
    or, when the ``time.perf_counter()`` ``deadline`` passes first, ``(bytes so far, None)`` with the child still
    running. Never waits for end of file (see the module docstring).

    A forked descendant holds a copy of the pipe's write end for as long as it lives, so the reader watches the
    process itself (a pidfd, or ``waitpid`` polled where there is none) and takes what is in the pipe once it has
    exited.
    """
    exited = exit_fd(pid)
    chunks: list[bytes] = []
    pipe_open = True
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                chunks.append(drain(fd) if pipe_open else b"")
                return b"".join(chunks), status
            remaining = None if deadline is None else deadline - time.perf_counter()
            if remaining is not None and remaining <= 0:
                return b"".join(chunks), None
            watched = ([fd] if pipe_open else []) + ([exited] if exited is not None else [])
            wait = remaining if exited is not None else min(POLL, remaining or POLL)
            ready, _, _ = select.select(watched, [], [], wait)
            if fd in ready:
                chunk = os.read(fd, 1 << 16)
                chunks.append(chunk)
                pipe_open = bool(chunk)
    finally:
        if exited is not None:
            os.close(exited)


def exit_fd(pid: int) -> int | None:
    """A file descriptor that becomes readable when ``pid`` exits (Linux 5.3+), or None."""
    try:
        return os.pidfd_open(pid)  # type: ignore[attr-defined,no-any-return]
    except (AttributeError, OSError):
        return None


def drain(fd: int) -> bytes:
    """What is left in the pipe ``fd``, without waiting for more (a descendant may hold its write end open)."""
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    try:
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    finally:
        os.set_blocking(fd, True)
    return b"".join(chunks)
