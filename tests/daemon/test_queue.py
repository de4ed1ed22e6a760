"""The daemon's queue per device, its cancel and its clean stop, through real daemons and real commands.

Eight clients at once on the CPU device (four ``check`` and four ``tune`` of different scripts) answer what the
same commands answer run one after another without the daemon, their device lock is held by one at a time
(the daemon's log keeps each lock's reported times) and ``autobatch daemon status --json`` shows the queue
while they wait. ``autobatch daemon cancel ID`` and SIGTERM to the daemon end a running tune as an interrupted
tune ends (exit 143, its measured probes kept in its result file) and the daemon serves the next request."""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, run_cli

from autobatch.daemon.client import Client
from autobatch.daemon.place import Place

from .test_daemon import CHECK, MEASURED, env_for, gone, wait_for

SCRIPTS = ROOT / "tests" / "scripts"
BAD = SCRIPTS / "bad"
SMALL = ("--device", "cpu", "--memory", "512MiB", "-p", "32-true", "-o", "sgd")
#: Four different tiny scripts; sleepy.py sleeps as long as SLEEPY_SECONDS says (0 here).
NAMES = ("small_cnn", "quadratic", "args_echo", "sleepy")
QUIET = {"SLEEPY_SECONDS": "0"}


def tune(name: str) -> tuple[str, ...]:
    # Capped low and searched for the largest batch only (no timing probes): a few probes each, and an answer
    # (capped at 8) that noise cannot move. --no-cache: each really probes, in-process and through the daemon.
    return ("tune", str(SCRIPTS / f"{name}.py"), *SMALL, "--no-recompute", "--max-batch-size", "8",
            "--objective", "max-batch", "--no-cache", "--json")  # fmt: skip


def check(name: str) -> tuple[str, ...]:
    return ("check", str(SCRIPTS / f"{name}.py"), *CHECK[2:])


def answer(command: str, stdout: str) -> object:
    """What must be the same in-process and through the daemon: not what a run measures (times, bytes)."""
    data = json.loads(stdout)
    if command == "check":
        return {k: v for k, v in data.items() if k not in MEASURED}
    return {
        "status": data["status"],
        "chosen": {k: data["chosen"][k] for k in ("precision", "optimizer", "recompute", "micro_batch_size")},
        "maxima": [(c["precision"], c["optimizer"], c["status"], c["max_batch_size"]) for c in data["combinations"]],
    }  # fmt: skip


LOCK_LINE = re.compile(r" (r\d+): device lock (running|released) at (\S+) on (.+)$")
STARTED_LINE = re.compile(r" (r\d+) pid \d+: autobatch (\w+) ")


def held(log: str) -> tuple[dict[str, str], list[tuple[float, float, str]]]:
    """From the daemon's log: each request's command, and every (from, to, request) a device lock was held."""
    commands = {m[1]: m[2] for m in map(STARTED_LINE.search, log.splitlines()) if m}
    taken: dict[str, float] = {}
    spans = []
    for match in filter(None, map(LOCK_LINE.search, log.splitlines())):
        request, state, stamp = match[1], match[2], datetime.datetime.fromisoformat(match[3]).timestamp()
        if state == "running":
            taken[request] = stamp
        else:
            spans.append((taken.pop(request), stamp, request))
    assert taken == {}, f"locks never released: {taken}"
    return commands, sorted(spans)


@pytest.mark.slow
def test_eight_clients_at_once_answer_as_in_process_one_tune_at_a_time(place: Place, tmp_path: Path) -> None:
    jobs = [check(name) for name in NAMES] + [tune(name) for name in NAMES]
    expected = []
    for i, args in enumerate(jobs):  # one after another, without the daemon
        folder = tmp_path / f"here{i}"
        folder.mkdir()
        done = run_cli(*args, cwd=folder, env=QUIET)
        expected.append((done.returncode, answer(args[0], done.stdout) if done.returncode == 0 else None))
    assert [code for code, _ in expected] == [0] * 8, expected

    clients = []
    for i, args in enumerate(jobs):  # all at once, through one daemon (the first of them starts it)
        folder = tmp_path / f"through{i}"
        folder.mkdir()
        clients.append(
            subprocess.Popen(
                [sys.executable, "-m", "autobatch", *args],
                cwd=folder,
                text=True,
                env={**os.environ, "NO_COLOR": "1", **QUIET, **env_for(place, "on")},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )  # fmt: skip
        )
    try:

        def queue() -> dict[str, object] | None:  # a status with a request running and another queued on cpu
            status = json.loads(run_cli("daemon", "status", "--json", env=env_for(place)).stdout)
            states = [r["state"] for r in status.get("requests", [])]
            return status if "running" in states and "queued" in states else None

        status = wait_for(queue, 300)
        waiting = [r for r in status["requests"] if r["state"] == "queued"]
        assert all(r["device"].startswith("cpu") and r["script"].endswith(".py") for r in waiting), status
        outputs = [client.communicate(timeout=1200) for client in clients]
    finally:
        for client in clients:
            client.kill()
    got = [
        (c.returncode, answer(args[0], out) if c.returncode == 0 else err)
        for c, args, (out, err) in zip(clients, jobs, outputs)
    ]  # fmt: skip
    assert got == expected

    commands, spans = held(place.log.read_text())
    assert sorted(commands.values()) == ["check"] * 4 + ["tune"] * 4  # every one went through the daemon
    assert sorted({request for _, _, request in spans}) == sorted(commands)  # each held the device lock
    for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
        assert end <= start, f"{first} and {second} held the device lock at once"


def slow_tune(folder: Path) -> tuple[str, ...]:
    """A tune of slow steps (each probe takes seconds), in ``folder``: interrupted mid-search."""
    script = folder / "slow_steps.py"
    script.write_text((BAD / "slow_steps.py").read_text())
    return ("tune", str(script), *SMALL, "--no-recompute", "--no-cache")


def after_probes(folder: Path, n: int) -> bool:
    try:
        result = json.loads((folder / "autobatch-result.json").read_text())
    except (OSError, ValueError):
        return False
    return sum(p["kind"] in ("fits", "oom") for c in result["combinations"] for p in c["trace"]) >= n


def interrupted(folder: Path) -> dict[str, object]:
    result = json.loads((folder / "autobatch-result.json").read_text())
    assert result["status"] == "interrupted"
    assert sum(p["kind"] == "fits" for c in result["combinations"] for p in c["trace"]) >= 2  # kept
    return result  # type: ignore[no-any-return]


def start_tune(place: Place, folder: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "autobatch", *slow_tune(folder)], cwd=folder, text=True,
        env={**os.environ, "NO_COLOR": "1", "SLOW_STEP_SECONDS": "0.3", **env_for(place, "on")},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


@pytest.mark.slow
def test_cancel_ends_a_request_which_keeps_its_probes_and_the_next_is_served(
    place: Place, tmp_path: Path
) -> None:
    client = start_tune(place, tmp_path)
    try:
        wait_for(lambda: after_probes(tmp_path, 2), 300)
        request = Client(place).status()["requests"][0]  # type: ignore[index]
        cancelled = run_cli("daemon", "cancel", request["id"], env=env_for(place))
        assert cancelled.returncode == 0, cancelled.stderr
        _, err = client.communicate(timeout=120)
    finally:
        client.kill()
    assert client.returncode == 143, err
    assert "probes measured so far are kept" in " ".join(err.split())
    interrupted(tmp_path)
    wait_for(lambda: gone(int(request["pid"])) and Client(place).status()["requests"] == [], 60)  # type: ignore[index]
    unknown = run_cli("daemon", "cancel", request["id"], env=env_for(place))
    assert unknown.returncode != 0 and request["id"] in unknown.stderr
    assert run_cli(*CHECK, cwd=tmp_path, env=env_for(place)).returncode == 0  # the next one is served


@pytest.mark.slow
def test_sigterm_to_the_daemon_keeps_a_running_tunes_partial_results(place: Place, tmp_path: Path) -> None:
    client = start_tune(place, tmp_path)
    try:
        wait_for(lambda: after_probes(tmp_path, 2), 300)
        status = Client(place).status()
        assert status is not None
        os.kill(int(status["pid"]), signal.SIGTERM)
        _, err = client.communicate(timeout=120)
    finally:
        client.kill()
    assert client.returncode == 143, err
    assert "probes measured so far are kept" in " ".join(err.split())
    interrupted(tmp_path)
    wait_for(lambda: gone(int(status["pid"])), 60)
    assert not place.socket.exists()
