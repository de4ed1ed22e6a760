"""A command whose log or stdout cannot be written still does its work (autobatch.cli.streams), a SIGHUP ends
a tune as SIGTERM does, and no line is wrapped off a terminal.

Before the fixes: a tune with ``2>&1 | head -1`` or ``--json | true`` exited 1 (the result file left ``failed``
as it was written at the start, or complete and the exit code wrong), with stderr closed (``2>&-``) or on a full
disk (``2>/dev/full``) it exited 1 with no result file; SIGHUP killed it (exit 129 from a shell) with its result
``running`` and its lock files left in the user's folder; a long error line and estimate's closing note were
wrapped at 160 (COLUMNS) columns in a log.

The fast tests run the real command with a fake probe runner (tests/fake_cli.py); the slow ones run
``python -m autobatch`` on examples/mlp.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support import EXAMPLES, ROOT, run_cli

FAKE_CLI = str(ROOT / "tests" / "fake_cli.py")
TUNE = ["tune", "train.py", "--device", "cpu", "--memory", "1GiB", "-p", "32-true", "--no-recompute"]
REAL = [
    "tune", str(EXAMPLES / "mlp.py"), "--device", "cpu", "--memory", "600MiB", "-p", "32-true", "-o", "sgd",
    "--no-recompute", "--objective", "max-batch", "--no-cache",
]  # fmt: skip


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOBATCH_")}
    env.update(NO_COLOR="1", PYTHONPATH=str(ROOT), AUTOBATCH_CACHE_DIR=str(tmp_path / "cache"),
               AUTOBATCH_LOCK_DIR=str(tmp_path / "locks"))  # fmt: skip
    return {**env, **extra}


@contextmanager
def _closed_pipe() -> Iterator[int]:
    """The write end of a pipe whose reader has gone (``| true``): every write to it fails with EPIPE."""
    read, write = os.pipe()
    os.close(read)
    try:
        yield write
    finally:
        os.close(write)


def _fake(tmp_path: Path, *args: str, stdout: Any, stderr: Any, shell_redirect: str = "") -> int:
    """The exit code of ``autobatch ARGS`` with a fake probe runner in ``tmp_path``; ``shell_redirect``: what a
    shell adds to the command line (``2>&-``)."""
    (tmp_path / "train.py").write_text("# the fake runner never imports it\n")
    argv = [sys.executable, FAKE_CLI, str(tmp_path / "probes.jsonl"), "--", *args]
    if shell_redirect:
        argv = ["sh", "-c", f'exec "$@" {shell_redirect}', "sh", *argv]
    proc = subprocess.run(argv, cwd=tmp_path, env=_env(tmp_path), stdout=stdout, stderr=stderr, timeout=120)
    return proc.returncode


def _complete(path: Path) -> dict[str, Any]:
    result = json.loads(path.read_text())
    assert result["status"] == "complete", result["notes"]
    assert result["chosen"] is not None
    assert not [p.name for p in path.parent.glob(f".{path.name}.*")], "the result file's lock was left"
    return result  # type: ignore[no-any-return]


STREAM_FAULTS = [
    "stderr-pipe-closed",
    "stdout-pipe-closed",
    "both-pipe-closed",
    "stderr-closed",
    "stderr-full-disk",
]


@contextmanager
def _streams(fault: str) -> Iterator[tuple[Any, Any, str]]:
    """(stdout, stderr, shell redirect) of ``fault``."""
    with _closed_pipe() as pipe, open(os.devnull, "w") as null:
        yield {
            "stderr-pipe-closed": (null, pipe, ""),
            "stdout-pipe-closed": (pipe, null, ""),
            "both-pipe-closed": (pipe, pipe, ""),
            "stderr-closed": (null, null, "2>&-"),
            "stderr-full-disk": (null, open("/dev/full", "w"), ""),  # noqa: SIM115  # closed with the process
        }[fault]


@pytest.mark.parametrize("fault", STREAM_FAULTS)
@pytest.mark.parametrize("cached", [False, True], ids=["measured", "from-the-cache"])
def test_a_tune_whose_log_or_stdout_fails_finishes_and_writes_its_result(
    tmp_path: Path, fault: str, cached: bool
) -> None:
    if cached:  # a first run stores the answer; the run under test is served it
        assert _fake(tmp_path, *TUNE, "--output", "first.json", stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL) == 0  # fmt: skip
    with _streams(fault) as (stdout, stderr, redirect):
        code = _fake(tmp_path, *TUNE, "--json", "--verbose", "--output", "r.json", stdout=stdout, stderr=stderr,
                     shell_redirect=redirect)  # fmt: skip
    assert code == 0
    result = _complete(tmp_path / "r.json")
    assert bool((result.get("cache") or {}).get("served")) == cached


def test_a_failing_log_keeps_the_exit_code_the_command_would_have_had(tmp_path: Path) -> None:
    """A tune that fails (a memory below what the model needs) exits with its code, its log on a closed pipe."""
    args = (*TUNE[:5], "1MiB", *TUNE[6:], "--output", "r.json")
    with open(tmp_path / "err.txt", "w") as err:
        logged = _fake(tmp_path, *args, stdout=subprocess.DEVNULL, stderr=err)
    assert logged not in (0, 1) and "error:" in (tmp_path / "err.txt").read_text()
    with _closed_pipe() as pipe:
        assert _fake(tmp_path, *args, stdout=pipe, stderr=pipe) == logged
    assert json.loads((tmp_path / "r.json").read_text())["status"] == "failed"


def test_sighup_ends_a_tune_as_sigterm_does(tmp_path: Path) -> None:
    """A closed ssh session: exit 129, the probes measured kept, the result interrupted, no lock file left."""
    (tmp_path / "train.py").write_text("# the fake runner never imports it\n")
    log = tmp_path / "probes.jsonl"
    proc = subprocess.Popen(
        [sys.executable, FAKE_CLI, str(log), "--", *TUNE, "--output", "r.json"], cwd=tmp_path,
        env=_env(tmp_path, FAKE_PROBE_SECONDS="1"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while '"op": "probe"' not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 129, err
    assert "hung up: probes stopped; the probes measured so far are kept" in err
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["status"] == "interrupted" and result["probes"] >= 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def _interrupted_after_probes(tmp_path: Path, log: Path, count: int) -> str:
    """The stderr of a tune SIGTERMed once the fake runner has measured ``count`` probes in all (``log``)."""
    proc = subprocess.Popen(
        [sys.executable, FAKE_CLI, str(log), "--", *TUNE, "--output", "r.json"], cwd=tmp_path,
        env=_env(tmp_path, FAKE_PROBE_SECONDS="1"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while (log.read_text() if log.exists() else "").count(
        '"op": "probe"'
    ) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    return err


def test_a_rerun_interrupted_again_counts_its_probes_and_those_replayed(tmp_path: Path) -> None:
    """The re-run of an interrupted tune replays its probes from the journal: its partial result's line names
    both ("1 probes" of a trace of three before)."""
    (tmp_path / "train.py").write_text("# the fake runner never imports it\n")
    log = tmp_path / "probes.jsonl"
    first = _interrupted_after_probes(tmp_path, log, 2)
    assert (
        "partial result (interrupted, 1 probe) saved" in first or "(interrupted, 2 probes) saved" in first
    ), first
    again = _interrupted_after_probes(tmp_path, log, 3)
    line = next(line for line in again.splitlines() if "partial result (interrupted" in line)
    result = json.loads((tmp_path / "r.json").read_text())
    replayed = sum(probe["cached"] for combo in result["combinations"] for probe in combo["trace"])
    assert replayed >= 1 and f" and {replayed} from the journal) saved" in line, line
    assert " 1 probes" not in line


@pytest.mark.slow
def test_the_tune_waiting_for_another_computing_it_says_so_in_words(tmp_path: Path) -> None:
    """The second of two identical tunes sharing a cache waits for the first: "the tune KEY is free after"."""
    (tmp_path / "train.py").write_text("# the fake runner never imports it\n")
    log = tmp_path / "probes.jsonl"

    def start(i: int) -> subprocess.Popen[str]:
        env = _env(tmp_path, FAKE_PROBE_SECONDS="0.5", AUTOBATCH_LOCK_DIR=str(tmp_path / f"node{i}-locks"))
        return subprocess.Popen(
            [sys.executable, FAKE_CLI, str(log), "--", *TUNE, "--output", f"r{i}.json"], cwd=tmp_path, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    first = start(0)
    deadline = time.monotonic() + 60
    while '"op": "probe"' not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.05)
    second = start(1)
    _, err = second.communicate(timeout=120)
    first.communicate(timeout=120)
    assert second.returncode == 0, err
    waiting = [line for line in err.splitlines() if "which another run is computing" in line]
    assert waiting and ": held by pid" in waiting[0], err
    free = [line for line in err.splitlines() if "is free after" in line]
    assert len(free) == 1 and " computing is free" not in free[0], err
    assert free[0].split(" ", 2)[2].startswith("the tune ") and ", which" not in free[0]


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["2>&1 | head -1", "2>&-"])
def test_a_real_tune_survives_its_log_going_away(tmp_path: Path, fault: str) -> None:
    """What a job script does: the tune's log through `head -1`, or its stderr closed. The log goes away before
    the first probe, so a short search (16 at most: two or three probes) writes to it as much as a long one.
    Closed stderr holds end to end whatever guards it: the descriptors Python opens are not inherited (PEP 446),
    so a probe never writes into the file that took number 2; :func:`autobatch.cli.streams.guard`'s reopening
    is for what the command itself writes to descriptor 2 (the fast cases above)."""
    argv = [sys.executable, "-m", "autobatch", *REAL, "--max-batch-size", "16", "--output", "r.json"]
    env = _env(tmp_path)
    if fault == "2>&-":
        proc = subprocess.run(["sh", "-c", 'exec "$@" 2>&-', "sh", *argv], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, timeout=600)  # fmt: skip
        code = proc.returncode
    else:
        with subprocess.Popen(
            argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        ) as p:
            assert p.stdout is not None
            assert b"autobatch tune" in p.stdout.readline()
            p.stdout.close()  # head -1 has its line
            code = p.wait(timeout=600)
    assert code == 0
    _complete(tmp_path / "r.json")


@pytest.mark.slow
def test_estimate_json_into_a_closed_pipe_and_its_note_on_one_line(tmp_path: Path) -> None:
    from autobatch.cli.estimate import CAVEATS_CPU

    with _closed_pipe() as pipe, open(tmp_path / "err.txt", "w") as err:
        proc = subprocess.run(
            [sys.executable, "-m", "autobatch", "estimate", str(EXAMPLES / "mlp.py"), "--device", "cpu", "--memory",
             "600MiB", "-p", "32-true", "-o", "sgd", "--no-recompute", "--json"],
            cwd=tmp_path, env={**_env(tmp_path), "COLUMNS": "160"}, stdout=pipe, stderr=err, timeout=600,
        )  # fmt: skip
    log = (tmp_path / "err.txt").read_text()
    assert proc.returncode == 0, log
    assert f"note: {CAVEATS_CPU}" in log.splitlines(), log


@pytest.mark.slow
def test_the_lock_timeout_error_is_one_line_in_a_log(tmp_path: Path) -> None:
    """The device stays busy past --lock-timeout (exit 7): one `error:` line however long, one `hint:` line."""
    from autobatch.run.locks import RunLock

    host = socket.gethostname()
    holder = "autobatch tune " + "a-long-argument " * 20
    with RunLock.device(f"host-{host}", f"cpu ({host})", folder=tmp_path / "locks", command=holder):
        proc = run_cli(*REAL, "--lock-timeout", "1", "--output", str(tmp_path / "r.json"), cwd=tmp_path,
                       env={"AUTOBATCH_LOCK_DIR": str(tmp_path / "locks")})  # fmt: skip
    assert proc.returncode == 7, proc.stderr
    lines = proc.stderr.splitlines()
    error = [line for line in lines if line.startswith("error:")]
    assert len(error) == 1 and holder.strip() in error[0], proc.stderr
    assert "stayed busy for 1 s" in error[0]
    assert lines[lines.index(error[0]) + 1].startswith("hint:"), proc.stderr
