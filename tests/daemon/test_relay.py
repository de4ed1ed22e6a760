"""A relay that breaks mid-command, through real daemons and real tunes.

The client's connection is cut from outside it mid-tune (a copy of its descriptor, taken with ``pidfd_getfd``,
shut down: the client reads the end of its answer while the daemon still runs the tune): the command then runs
in the client's own process only once the daemon's run has ended, from the probes that run measured, with one
note saying so, and answers what an in-process run answers; the script's own witness (an exclusive lock each
of its processes holds while it lives) shows that no two of its probes ever ran at once. A client killed with
output of its command unread (its connection reset) has its command ended as any client that goes away.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import SCRIPTS, run_cli

from autobatch.daemon.client import Client
from autobatch.daemon.place import Place

from .test_daemon import env_for, gone, wait_for
from .test_queue import after_probes, answer, interrupted

SLOW_SOURCE = SCRIPTS / "as_is" / "slow_source.py"
#: Capped low: two sizes and the confirmation, an answer noise cannot move.
TUNE = ("tune", str(SLOW_SOURCE), "--device", "cpu", "--memory", "512MiB", "--objective", "max-batch",
        "--max-batch-size", "16", "--json", "--", "--batch-size", "{batch}")  # fmt: skip
#: The number of pidfd_getfd(2) (Linux 5.6), the same on every architecture; Python 3.11 has no wrapper.
PIDFD_GETFD = 438


def witness(folder: Path) -> dict[str, str]:
    """The script's witness in ``folder`` (neither a working folder nor the script's: a probe may write there)."""
    folder.mkdir()
    return {"OVERLAP_LOCK": str(folder / "held"), "OVERLAP_LOG": str(folder / "beside")}


def start(place: Place, folder: Path, args: tuple[str, ...], env: dict[str, str]) -> subprocess.Popen[str]:
    folder.mkdir()
    return subprocess.Popen(
        [sys.executable, "-m", "autobatch", *args], cwd=folder, text=True,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "400", **env, **env_for(place)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def cut(client: subprocess.Popen[str], daemon: Path) -> None:
    """Shut down ``client``'s connection to the daemon at ``daemon`` from outside the client: a copy of its
    descriptor names the same connection, and shutting it down ends it for both."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(client.pid)
    try:
        for fd in os.listdir(f"/proc/{client.pid}/fd"):
            try:
                if not os.readlink(f"/proc/{client.pid}/fd/{fd}").startswith("socket:"):
                    continue
            except OSError:
                continue
            copy = libc.syscall(PIDFD_GETFD, pidfd, int(fd), 0)
            if copy < 0:
                pytest.skip(f"pidfd_getfd: {os.strerror(ctypes.get_errno())}")
            with socket.socket(fileno=copy) as connection:
                if connection.family == socket.AF_UNIX and connection.getpeername() == str(daemon):
                    connection.shutdown(socket.SHUT_RDWR)
                    return
    finally:
        os.close(pidfd)
    raise AssertionError("the client has no connection to the daemon")


@pytest.mark.slow
def test_a_tune_whose_connection_is_cut_runs_here_after_the_daemons_run_from_its_probes(
    place: Place, tmp_path: Path
) -> None:
    env = {"STEP_SECONDS": "0.2", **witness(tmp_path / "witness")}
    (tmp_path / "here").mkdir()
    here = run_cli(*TUNE, cwd=tmp_path / "here",
                   env={**env, "AUTOBATCH_DAEMON": "off", "AUTOBATCH_CACHE_DIR": str(tmp_path / "cache-here")})  # fmt: skip
    assert here.returncode == 0, here.stderr

    client = start(place, tmp_path / "through", TUNE, env)
    try:
        wait_for(lambda: after_probes(tmp_path / "through", 1), 300)  # journaled, and the next one under way
        command = int(Client(place).status()["requests"][0]["pid"])  # type: ignore[index]
        cut(client, place.socket)
        out, err = client.communicate(timeout=300)
    finally:
        client.kill()
    assert client.returncode == here.returncode, err
    assert answer("tune", out) == answer("tune", here.stdout)
    # no probe of the run here ran beside one of the daemon's (nor any two of either)
    assert not Path(env["OVERLAP_LOG"]).exists(), Path(env["OVERLAP_LOG"]).read_text()
    notes = [line for line in err.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1, err
    assert notes[0].startswith(
        "note: the connection to the autobatch daemon broke while it ran this command ("
    )
    assert "its run there has ended: running it in this process" in notes[0]
    assert gone(command) and "r1 ended with exit code 143" in place.log.read_text()  # the daemon's run ended
    trace = [probe for combo in json.loads(out)["combinations"] for probe in combo["trace"]]
    assert [p["batch_size"] for p in trace] == [8, 16, 16], trace
    assert trace[0]["cached"] and not trace[-1]["cached"], (
        trace
    )  # the daemon's probes picked up, the rest run here


@pytest.mark.slow
def test_a_client_killed_with_output_unread_has_its_command_ended(place: Place, tmp_path: Path) -> None:
    uncapped = tuple(a for a in TUNE if a not in ("--max-batch-size", "16"))  # a long tune
    client = start(place, tmp_path / "work", uncapped, {"STEP_SECONDS": "0.2"})
    try:
        wait_for(lambda: after_probes(tmp_path / "work", 1), 300)
        command = int(Client(place).status()["requests"][0]["pid"])  # type: ignore[index]
        client.send_signal(signal.SIGSTOP)
        wait_for(lambda: after_probes(tmp_path / "work", 2), 120)  # its line waits in the connection, unread
        time.sleep(0.5)
    finally:
        client.kill()
        client.wait()
    wait_for(lambda: gone(command), 60)
    log = place.log.read_text()
    assert "r1 ended with exit code 143" in log and "Traceback" not in log, log
    interrupted(tmp_path / "work")  # ended as an interrupted tune: its probes kept
    wait_for(lambda: Client(place).status()["requests"] == [], 30)  # type: ignore[index]
