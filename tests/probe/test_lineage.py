"""A report is read when its writer exits, not when every copy of the pipe is closed; the subreaper ends every
descendant, those in a session of their own included (real processes, no probe server)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from autobatch.probe.lineage import interrupts_held, read_until_exit

#: Writes its report after starting a helper that keeps a copy of the report pipe, then exits.
WRITER = textwrap.dedent(
    """
    import os, subprocess, sys
    fd = int(sys.argv[1])
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=[fd])
    os.write(fd, f"report {helper.pid}".encode())
    """
)

#: A subreaper whose child leaves a grandchild in a session of its own, then ends its descendants.
SUBREAPER = textwrap.dedent(
    """
    import json, subprocess, sys, time
    from autobatch.probe.lineage import become_subreaper, end_descendants
    become_subreaper()
    child = subprocess.run(
        [sys.executable, "-c", "import subprocess, sys; "
         "print(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"],
        capture_output=True, text=True, check=True,
    )
    detached = int(child.stdout)
    time.sleep(0.2)
    import psutil
    below = [p.pid for p in psutil.Process().children(recursive=True)]
    end_descendants()
    print(json.dumps({"detached": detached, "below": below, "left": [p.pid for p in psutil.Process().children(recursive=True)]}))
    """
)


def test_a_report_is_read_when_its_writer_exits_though_a_helper_holds_the_pipe() -> None:
    read_fd, write_fd = os.pipe()
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(write_fd)], pass_fds=[write_fd])
    os.close(write_fd)
    started = time.perf_counter()
    try:
        data, status = read_until_exit(read_fd, writer.pid, started + 30)
        assert status == 0
        assert data.startswith(b"report ")
        assert time.perf_counter() - started < 20  # not the helper's 60 s, nor the deadline
    finally:
        os.close(read_fd)
        for process in psutil.Process().children(recursive=True):
            process.kill()


def test_the_deadline_passes_with_the_writer_running() -> None:
    read_fd, write_fd = os.pipe()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=[write_fd])
    os.close(write_fd)
    try:
        data, status = read_until_exit(read_fd, sleeper.pid, time.perf_counter() + 0.5)
        assert (data, status) == (b"", None)
        assert sleeper.poll() is None
    finally:
        os.close(read_fd)
        sleeper.kill()
        sleeper.wait()


def test_the_subreaper_ends_a_descendant_in_a_session_of_its_own() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run(
        [sys.executable, "-c", SUBREAPER], capture_output=True, text=True, timeout=60, env=env, check=True
    )
    seen = json.loads(run.stdout)
    try:
        assert seen["detached"] in seen["below"]  # reparented to the subreaper, not to init
        assert seen["left"] == []
        assert not psutil.pid_exists(seen["detached"])
    finally:
        if psutil.pid_exists(seen["detached"]):
            os.kill(seen["detached"], signal.SIGKILL)


def test_ctrl_c_while_a_process_starts_is_held_until_its_handle_is_kept() -> None:
    """A real SIGINT inside the block (as Ctrl-C in a notebook cell that starts a probe server) does not interrupt
    it: the block ends with the handle kept, then the interrupt is raised (a KeyboardInterrupt between the fork
    and the assignment left a server nobody stopped)."""
    kept: list[subprocess.Popen[bytes]] = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler has run by now: it held the interrupt
            kept.append(subprocess.Popen([sys.executable, "-c", "pass"]))
    assert len(kept) == 1 and kept[0].wait(timeout=30) == 0
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is Python's again
    with interrupts_held():  # nothing caught, nothing raised
        pass
