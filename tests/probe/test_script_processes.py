"""Processes the script starts (a ``multiprocessing`` prefetcher forked at import, a log shipper in a session
of its own that inherits stdout, a watchdog left behind by a shell) neither hold a probe's answer back nor
outlive it, and none survives a tune that ends, is interrupted or is killed. The scripts write their helpers'
pids to a file; survivors are found by those pids and by the shipper's session, never by name (slow: the real
command on the CPU device)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support import ROOT, SCRIPTS, run_cli

pytestmark = pytest.mark.slow

THREE_FUNCTIONS = SCRIPTS / "helpers" / "prefetching.py"
AS_IS = SCRIPTS / "as_is" / "prefetching_loop.py"
QUICK = ("--device", "cpu", "--memory", "512MiB", "--no-cache", "--timeout", "20", "--json")
#: The search of the three-function script: the one combination the as-is script has.
ONE = ("-p", "32-true", "-o", "adamw", "--no-recompute")


def tune_args(script: Path, *script_args: str) -> list[str]:
    if script == AS_IS:
        return [str(script), *QUICK, "--", "--batch-size", "{batch}", *script_args]
    return [str(script), *QUICK, *ONE, "--", *script_args]


def run_folder(tmp_path: Path) -> Path:
    """The folder the tune runs in; the pid file lives beside it, since a probe may not write into it."""
    folder = tmp_path / "run"
    folder.mkdir(exist_ok=True)
    return folder


def start_tune(
    argv: list[str], env: dict[str, str], tmp_path: Path, pid_file: Path
) -> subprocess.Popen[bytes]:
    """The tune in the background, once the script has started its helpers (their pids are in ``pid_file``)."""
    proc = subprocess.Popen(
        argv, cwd=run_folder(tmp_path), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 120
    while not (pid_file.exists() and pid_file.read_text().endswith("\n")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pid_file.exists(), "the script never started its helpers"
    return proc


def helper_pids(pid_file: Path) -> list[int]:
    """Every helper the script started (a line per import or run: prefetcher, shipper, watchdog)."""
    return [int(pid) for pid in pid_file.read_text().split()]


def shippers(pid_file: Path) -> list[int]:
    return [int(line.split()[1]) for line in pid_file.read_text().splitlines()]


def survivors(pid_file: Path, ended: float, grace: float = 5.0, shippers_too: bool = True) -> list[str]:
    """The helpers still running after ``grace`` seconds (created before the tune ended: not a later process
    that reused the pid), and any process in a shipper's session (``shippers_too``; else the shippers are
    left out)."""
    deadline = time.monotonic() + grace
    while (left := _running(pid_file, ended, shippers_too)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _running(pid_file: Path, ended: float, shippers_too: bool) -> list[str]:
    left = []
    skipped = set() if shippers_too else set(shippers(pid_file))
    for pid in helper_pids(pid_file):
        if pid in skipped:
            continue
        try:
            process = psutil.Process(pid)
            if process.status() != psutil.STATUS_ZOMBIE and process.create_time() <= ended:
                left.append(f"{pid} ({' '.join(process.cmdline())})")
        except psutil.Error:
            pass
    sessions = set(shippers(pid_file)) if shippers_too else set()
    for pid in psutil.pids():
        try:
            if os.getsid(pid) in sessions and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(f"{pid} in session {os.getsid(pid)}")
        except (OSError, psutil.Error):
            pass
    return left


def end(pid_file: Path) -> None:
    """Never leave a helper behind, even when the test fails."""
    for pid in helper_pids(pid_file) if pid_file.exists() else []:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.mark.parametrize("script", [THREE_FUNCTIONS, AS_IS], ids=["three-functions", "as-is"])
def test_helpers_started_by_the_script_change_neither_the_answer_nor_outlive_the_tune(
    script: Path, tmp_path: Path
) -> None:
    pid_file = tmp_path / "helpers.pid"
    temp = tmp_path / "tmp"  # the tune's temporary folders: the server's log, the probes' scratch folders
    temp.mkdir()
    env = {"TMPDIR": str(temp)}
    try:
        args = tune_args(script, "--pid-file", str(pid_file))
        proc = run_cli("tune", *args, cwd=run_folder(tmp_path), env=env, timeout=400)
        ended = time.time()
        assert proc.returncode == 0, proc.stderr
        assert leftovers(temp, grace=0) == []  # removed before the command exits
        (combo,) = json.loads(proc.stdout)["combinations"]
        kinds = {probe["kind"] for probe in combo["trace"]}
        assert kinds <= {"fits", "oom"}, proc.stderr  # no probe waited for a helper until its timeout
        assert len(helper_pids(pid_file)) >= 3 * combo["probes"]  # every probe started them
        assert survivors(pid_file, ended) == []
    finally:
        end(pid_file)
    alone = run_cli("tune", *tune_args(script, "--no-helpers"), cwd=run_folder(tmp_path), timeout=400)
    assert alone.returncode == 0, alone.stderr
    (without,) = json.loads(alone.stdout)["combinations"]
    assert combo["status"] == without["status"] == "exact"
    # the same answer, up to the flicker of a sample or two a CPU boundary shows between two runs
    assert abs(combo["max_batch_size"] - without["max_batch_size"]) <= 0.01 * without["max_batch_size"]


@pytest.mark.parametrize("script", [THREE_FUNCTIONS, AS_IS], ids=["three-functions", "as-is"])
def test_the_jobs_fresh_process_leaves_neither_a_helper_nor_a_folder(script: Path, tmp_path: Path) -> None:
    """The job's fresh process (measured by default, off elsewhere in the suite) is started by the command
    itself, beside its probe server, outside the server's reach: what the script started there ends with it
    (the shell's orphaned watchdog included), and so does its scratch folder."""
    pid_file = tmp_path / "helpers.pid"
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {"TMPDIR": str(temp), "AUTOBATCH_FRESH_BASELINE": "true"}
    try:
        args = tune_args(script, "--pid-file", str(pid_file))
        proc = run_cli("tune", *args, cwd=run_folder(tmp_path), env=env, timeout=400)
        ended = time.time()
        assert proc.returncode == 0, proc.stderr
        assert "probes count as the job's fresh process" in " ".join(proc.stderr.split())
        assert survivors(pid_file, ended) == []
        assert leftovers(temp, grace=0) == []
    finally:
        end(pid_file)


@pytest.mark.parametrize(
    ("script", "sig", "code", "fresh"),
    [
        (AS_IS, signal.SIGINT, 130, False),
        (AS_IS, signal.SIGTERM, 143, False),
        (AS_IS, signal.SIGKILL, -9, False),
        (AS_IS, signal.SIGKILL, -9, True),
        (THREE_FUNCTIONS, signal.SIGTERM, 143, False),
    ],
    ids=["as-is-SIGINT", "as-is-SIGTERM", "as-is-SIGKILL", "as-is-SIGKILL-fresh", "three-functions-SIGTERM"],
)
def test_an_interrupted_tune_leaves_no_process_of_the_script(
    script: Path, sig: signal.Signals, code: int, fresh: bool, tmp_path: Path
) -> None:
    """``fresh``: the job's fresh process measured, as by default; the script's helpers start there first, and
    the tune is killed while it steps (its death reaches that process, and the server, once per thread)."""
    pid_file = tmp_path / "helpers.pid"
    slow = ("--step-seconds", "0.5") if script == AS_IS else ()
    argv = [sys.executable, "-m", "autobatch", "tune", *tune_args(script, "--pid-file", str(pid_file), *slow)]
    temp = tmp_path / "tmp"  # the tune's temporary folders: the server's log, the probes' scratch folders
    temp.mkdir()
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT), "TMPDIR": str(temp)}
    if fresh:
        env["AUTOBATCH_FRESH_BASELINE"] = "true"
    try:
        proc = start_tune(argv, env, tmp_path, pid_file)
        time.sleep(0.3 if fresh else 1)  # inside the probe, or the fresh process (as is: in its slow steps)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)  # promptly, and no helper holds the tune's stderr open
        ended = time.time()
        assert proc.returncode == code, stderr.decode()
        assert survivors(pid_file, ended) == []
        # none is left, a tune killed outright included (its server removes them as it stops)
        assert leftovers(temp) == []
    finally:
        end(pid_file)


def leftovers(folder: Path, grace: float = 5.0) -> list[str]:
    """autobatch's temporary folders left in ``folder`` after ``grace`` seconds. The lock folder, shared by
    the machine's tunes, stays; so do what the script's own libraries leave when their processes are killed
    (``multiprocessing``'s ``pymp-*``) and torch's compile cache."""
    deadline = time.monotonic() + grace
    while (left := _temporaries(folder)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _temporaries(folder: Path) -> list[str]:
    return sorted(
        name
        for name in os.listdir(folder)
        if name.startswith(("autobatch-", "scratch-")) and name != "autobatch-locks"
    )


def test_a_server_killed_under_a_helper_is_noticed_at_once(tmp_path: Path) -> None:
    """The helper holds no copy of the protocol's pipes: the tune sees the server's death, not a timeout."""
    pid_file = tmp_path / "helpers.pid"
    args = tune_args(AS_IS, "--pid-file", str(pid_file), "--step-seconds", "0.5")
    argv = [sys.executable, "-m", "autobatch", "tune", *args]
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", "PYTHONPATH": str(ROOT)}
    try:
        proc = start_tune(argv, env, tmp_path, pid_file)
        (server,) = psutil.Process(proc.pid).children()
        server.kill()
        _, stderr = proc.communicate(timeout=120)
        ended = time.time()
        text = " ".join(stderr.decode().split())
        assert proc.returncode == 6, text
        assert "probe server was killed by signal 9 (SIGKILL)" in text
        # the helpers of the same session die with the tune's killpg (a SIGKILL the tune does not wait on: a
        # helper was seen still running right after the tune's exit); the shipper, in its own session, is out
        # of reach of a server killed outright (docs: how a tune works), so only the others are checked
        assert survivors(pid_file, ended, shippers_too=False) == []
    finally:
        end(pid_file)
