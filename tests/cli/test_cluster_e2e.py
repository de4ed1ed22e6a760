"""Issue 13's acceptance with the real command and real probes on the CPU device.

* A tune killed halfway with SIGTERM (a scheduler's preemption) and run again measures none of the
  probes it had measured: the re-run's new journal lines and the old ones share no probe.
* Two identical tunes started together on one cache and one device both succeed with the same
  result, and no probe of one ran while a probe of the other did (from the probes' start times and
  durations in each result's trace).
* Two jobs whose TMPDIR is each their own (a scheduler's) still share the device's lock.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import EXAMPLES

pytestmark = pytest.mark.slow

ARGS = ["--device", "cpu", "--memory", "400MiB", "-p", "32-true", "-o", "sgd", "--no-recompute"]


def command(tmp_path: Path, output: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "autobatch",
        "tune",
        str(EXAMPLES / "mlp.py"),
        *ARGS,
        "--output",
        str(tmp_path / output),
        "--json",
    ]


def environment(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOBATCH_")}
    env.update(
        NO_COLOR="1", AUTOBATCH_CACHE_DIR=str(tmp_path / "cache"), AUTOBATCH_LOCK_DIR=str(tmp_path / "locks")
    )
    return env


def journal_keys(tmp_path: Path) -> list[str]:
    (journal,) = (tmp_path / "cache").glob("*.jsonl")
    return [json.loads(line)["key"] for line in journal.read_text().splitlines() if '"key"' in line]


def test_a_preempted_tune_resumes_without_measuring_a_probe_twice(tmp_path: Path) -> None:
    env = environment(tmp_path)
    proc = subprocess.Popen(command(tmp_path, "first.json"), cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        journals = list((tmp_path / "cache").glob("*.jsonl")) if (tmp_path / "cache").is_dir() else []
        if journals and len(journal_keys(tmp_path)) >= 2:
            break
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    measured = journal_keys(tmp_path)
    assert len(measured) >= 2 and json.loads((tmp_path / "first.json").read_text())["status"] == "interrupted"

    again = subprocess.run(
        command(tmp_path, "second.json"), cwd=tmp_path, env=env, text=True, capture_output=True, timeout=600
    )
    assert again.returncode == 0, again.stderr
    new = journal_keys(tmp_path)[len(measured) :]
    assert not set(new) & set(measured), "a probe measured before the SIGTERM was measured again"
    trace = json.loads(again.stdout)["combinations"][0]["trace"]
    assert sum(1 for p in trace if p["cached"]) == len(measured)
    assert sum(1 for p in trace if not p["cached"]) == len(new)


def test_two_identical_tunes_at_once_agree_and_never_probe_together(tmp_path: Path) -> None:
    env = environment(tmp_path)
    procs = [
        subprocess.Popen(
            command(tmp_path, f"r{i}.json"),
            cwd=tmp_path,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=600) for p in procs]
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
    results = [json.loads(out) for out, _ in outputs]
    assert results[0]["chosen"] == results[1]["chosen"]
    assert [c["max_batch_size"] for c in results[0]["combinations"]] == [
        c["max_batch_size"] for c in results[1]["combinations"]
    ]
    waited = [err for _, err in outputs if "waiting for " in err]  # for the tune's key: the first computes it
    assert len(waited) == 1 and "held by pid" in waited[0]
    spans = sorted(
        (p["started_at"], p["started_at"] + p["seconds"])
        for result in results
        for combo in result["combinations"]
        for p in combo["trace"]
        if not p["cached"]
    )
    assert spans, "no probe ran"
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start, "two probes ran at once"


#: Another job's tune holding this host's CPU lock in the default lock folder, as its TMPDIR places it.
HOLD = """
import sys, time
from autobatch.run.locks import RunLock
lock = RunLock.device(sys.argv[1], "cpu (another job)", command="another job's tune")
lock.acquire()
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_jobs_with_a_tmpdir_of_their_own_still_take_turns_on_the_device(tmp_path: Path) -> None:
    """A scheduler gives each job a TMPDIR of its own: the second job's tune waits for the first job's lock (here
    it gives up after 2 s, naming the holder) instead of probing the same device beside it."""
    env = {k: v for k, v in environment(tmp_path).items() if k != "AUTOBATCH_LOCK_DIR"}
    for job in ("job1", "job2"):
        (tmp_path / job).mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, f"host-{socket.gethostname()}", "120"],
        env={**env, "TMPDIR": str(tmp_path / "job1")},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        second = subprocess.run(
            [*command(tmp_path, "second.json"), "--lock-timeout", "2"],
            cwd=tmp_path,
            env={**env, "TMPDIR": str(tmp_path / "job2")},
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode == 7, second.stderr
    assert f"held by pid {holder.pid}" in second.stderr and "another job's tune" in second.stderr
