"""Faults injected into real tunes (issue #10): no process of the tune survives, no measured probe is
lost, and the run ends with a clear message and its documented exit code. Slow: each starts the real
probe server on a tiny model."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from autobatch.records.liveness import run_state

from . import faults
from .catalogue import BAD

pytestmark = pytest.mark.slow


#: The bad fixtures fault above batch 16: a search capped at 17 meets the fault once, at 17, instead of
#: bisecting down to it through several faulting probes (each a timeout or a crash, retried once).
FIRST_FAULT = ("--max-batch-size", "17")


def combo(run: faults.FaultRun) -> dict[str, object]:
    return run.result["combinations"][0]  # type: ignore[index,no-any-return]


def survived(run: faults.FaultRun) -> None:
    assert run.stray == [], run.stderr
    assert run.lost == 0, run.stderr
    assert "Traceback (most recent call last)" not in run.stderr


def test_a_probe_sigkilled_once_is_retried(tmp_path: Path) -> None:
    run = faults.run_fault("probe SIGKILLed", tmp_path, str(faults.slow_copy(tmp_path)), faults.kill_a_probe,
                           env=faults.SLOW, extra=("--max-batch-size", "64"))  # fmt: skip
    survived(run)
    assert run.code == 0, run.stderr
    assert (combo(run)["status"], combo(run)["max_batch_size"]) == ("capped", 64)


def test_a_probe_that_segfaults_limits_the_answer_and_exits_6(tmp_path: Path) -> None:
    run = faults.run_fault("segfault", tmp_path, str(BAD / "segfaults.py"), extra=FIRST_FAULT)
    survived(run)
    assert run.code == 6, run.stderr
    assert (combo(run)["status"], combo(run)["max_batch_size"]) == ("crash-limited", 16)
    assert "limited by a crash at batch 17, not by memory" in run.stderr
    assert "raise --timeout" not in run.stderr


def test_a_probe_that_hangs_limits_the_answer_and_exits_6(tmp_path: Path) -> None:
    run = faults.run_fault("hang", tmp_path, str(BAD / "hangs.py"), extra=(*FIRST_FAULT, "--timeout", "4"))
    survived(run)
    assert run.code == 6, run.stderr
    assert (combo(run)["status"], combo(run)["max_batch_size"]) == ("timeout-limited", 16)


def test_a_probe_exhausting_memory_is_an_out_of_memory(tmp_path: Path) -> None:
    run = faults.run_fault("hog", tmp_path, str(BAD / "hogs_memory.py"), extra=FIRST_FAULT)
    survived(run)
    assert run.code == 0, run.stderr
    assert (combo(run)["status"], combo(run)["max_batch_size"]) == ("exact", 16)


def test_the_probe_server_killed_ends_the_run_clearly(tmp_path: Path) -> None:
    run = faults.run_fault("server killed", tmp_path, str(faults.slow_copy(tmp_path)), faults.kill_the_server,
                           env=faults.SLOW)  # fmt: skip
    survived(run)
    assert run.code == 6, run.stderr
    assert "probe server was killed by signal 9 (SIGKILL)" in run.stderr
    assert run.result["status"] == "failed"


@pytest.mark.parametrize(
    ("sig", "code", "status"),
    [
        (signal.SIGKILL, -9, "running"),
        (signal.SIGINT, 130, "interrupted"),
        (signal.SIGTERM, 143, "interrupted"),
        # a closed ssh session; before, it killed the tune as SIGKILL does, its locks left in the folder
        (signal.SIGHUP, 129, "interrupted"),
    ],
    ids=["SIGKILL", "SIGINT", "SIGTERM", "SIGHUP"],
)
def test_the_tune_killed_leaves_no_process_and_keeps_its_probes(
    sig: signal.Signals, code: int, status: str, tmp_path: Path
) -> None:
    run = faults.run_fault(f"tune {sig.name}", tmp_path, str(faults.slow_copy(tmp_path)),
                           faults.signal_the_tune(sig), env=faults.SLOW)  # fmt: skip
    survived(run)
    assert run.code == code, run.stderr
    assert run.result["status"] == status
    if sig == signal.SIGKILL:
        assert run_state(run.result) == "dead"  # a reader tells it from a live run
    else:
        assert "probes measured so far are kept" in run.stderr
        # the result file's lock and its holder's file went with the run, not left in the user's folder
        assert [p.name for p in tmp_path.glob(".autobatch-result.json.*")] == []


def test_the_script_edited_between_probes_is_detected(tmp_path: Path) -> None:
    script = faults.slow_copy(tmp_path)
    run = faults.run_fault("edited", tmp_path, str(script), faults.edit_the_script(script), env=faults.SLOW)
    survived(run)
    assert run.code == 2, run.stderr
    assert "changed while it was being tuned" in run.stderr
