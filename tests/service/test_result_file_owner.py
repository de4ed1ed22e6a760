"""A result file says what the run that last wrote it did ("Answers that hold in the job, round two", 5).

* A run that fails, even before its first probe (the script's import, the device), replaces the file
  with a ``failed`` result whose ``notes`` say why, so that ``emit`` refuses it. Before the fix the
  previous run's ``complete`` answer stayed, and ``emit`` wrote it with exit 0.
* Two runs writing one file do not take turns silently: the second waits for the first (saying for
  whom), or gives up after ``--lock-timeout`` with exit 2 naming the holder, leaving the file alone.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import SCRIPTS, run_main, wire_fake_runner

from autobatch.cli.state import STATE
from autobatch.errors import EXIT_DEVICE, EXIT_SCRIPT, EXIT_USAGE
from autobatch.liveness import run_state, unfinished
from autobatch.testing import FakeRunner, affine

MiB = 1 << 20
QUICK = ("--device", "cpu", "--memory", "1GiB", "-p", "32-true", "-o", "sgd", "--no-recompute")


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeRunner:
    return wire_fake_runner(FakeRunner(affine(400 * MiB, 1.7 * MiB)), tmp_path, monkeypatch)


def answered_64() -> dict[str, object]:
    """A complete tune whose answer is micro-batch 64, in autobatch-result.json."""
    code, _, err = run_main("tune", "train.py", *QUICK, "--max-batch-size", "64")
    assert code == 0, err
    old = json.loads(Path("autobatch-result.json").read_text())
    assert old["status"] == "complete" and old["chosen"]["micro_batch_size"] == 64
    return old


def import_error(monkeypatch: pytest.MonkeyPatch) -> tuple[str, ...]:
    from reliability.inprocess import InProcessRunner

    script = str(SCRIPTS / "bad" / "import_error.py")
    monkeypatch.setattr(STATE, "runner_factory", lambda: InProcessRunner(script))
    return ("tune", script, *QUICK)


@pytest.mark.parametrize(
    ("failing", "exit_code", "why"),
    [
        (import_error, EXIT_SCRIPT, "ModuleNotFoundError"),
        (lambda _m: ("tune", "train.py", "--device", "cuda", "-p", "32-true", "-o", "sgd", "--no-recompute"),
         EXIT_DEVICE, "no CUDA device"),
    ],
    ids=["fails-at-import", "device-error"],
)  # fmt: skip
def test_a_run_that_fails_before_its_first_probe_replaces_the_previous_answer(
    fake: FakeRunner, monkeypatch: pytest.MonkeyPatch, failing, exit_code: int, why: str
) -> None:  # type: ignore[no-untyped-def]
    answered_64()
    code, _, err = run_main(*failing(monkeypatch))
    assert code == exit_code, err
    assert "partial result (failed, 0 probes) saved to autobatch-result.json" in err
    now = json.loads(Path("autobatch-result.json").read_text())
    assert now["status"] == "failed" and now["chosen"] is None and now["combinations"] == []
    assert any(note.startswith("failed: ") and why in note for note in now["notes"]), now["notes"]
    assert run_state(now) == "finished" and "failed before it chose" in (unfinished(now) or "")

    code, _, err = run_main("emit", "autobatch-result.json", "--format", "env")
    assert code == EXIT_USAGE, err
    assert "no configuration to emit: the tune that wrote this result failed" in err
    assert not Path("autobatch.env").exists()


def test_a_run_marks_its_file_as_its_own_from_the_start(fake: FakeRunner) -> None:
    """While a run has measured nothing yet (waiting for its device), the file is already this run's."""
    from autobatch.records.result import TuneResult

    answered_64()
    seen: list[dict[str, object]] = []
    real = fake.run

    def first_probe(request):  # type: ignore[no-untyped-def]
        if not seen:
            seen.append(json.loads(Path("autobatch-result.json").read_text()))
        return real(request)

    fake.run = first_probe  # type: ignore[method-assign]
    code, _, err = run_main("tune", "train.py", *QUICK, "--max-batch-size", "32", "--refresh")
    assert code == 0, err
    (first,) = seen
    assert first["status"] == "running" and first["chosen"] is None and first["combinations"] == []
    assert run_state(first) == "alive"  # this process, still running
    TuneResult.from_dict(first)  # a valid result, as every reader reads it
    assert json.loads(Path("autobatch-result.json").read_text())["chosen"]["micro_batch_size"] == 32


HOLD = """
import sys, time
from autobatch.run.locks import RunLock

lock = RunLock.result_file(sys.argv[1], command="autobatch tune other.py")
lock.acquire()
print("held", flush=True)
time.sleep(float(sys.argv[2]))
lock.release()
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[object]:
    """Another process that holds r.json's lock for the given seconds (as a run writing it does)."""
    started: list[subprocess.Popen[str]] = []

    def hold(seconds: float) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(tmp_path / "r.json"), str(seconds)], stdout=subprocess.PIPE, text=True
        )  # fmt: skip
        started.append(process)
        assert process.stdout is not None and process.stdout.readline().strip() == "held"
        return process

    yield hold
    for process in started:
        process.kill()
        process.wait()


def test_a_second_run_on_the_same_file_gives_up_naming_the_holder(
    fake: FakeRunner, holder, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "r.json").write_text('{"the other run": "writes this"}\n')
    process = holder(60)
    code, _, err = run_main("tune", "train.py", *QUICK, "--output", "r.json", "--lock-timeout", "1")
    assert code == EXIT_USAGE, err
    assert "waiting for the result file r.json, which another run writes" in err
    assert f"another run writes the result file r.json (held by pid {process.pid} on" in err
    assert "(autobatch tune other.py)" in err and "gave up after 1 s" in err and "--output" in err
    assert (tmp_path / "r.json").read_text() == '{"the other run": "writes this"}\n'  # left alone
    assert not [r for r in fake.requests if r.op == "probe"], "nothing probed"


@pytest.mark.slow
def test_a_second_run_on_the_same_file_waits_for_the_first(fake: FakeRunner, holder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    holder(1.5)
    code, _, err = run_main("tune", "train.py", *QUICK, "--output", "r.json")
    assert code == 0, err
    assert "waiting for the result file r.json, which another run writes: held by pid" in err
    assert "the result file r.json is free after" in err
    assert json.loads((tmp_path / "r.json").read_text())["status"] == "complete"
    assert not (tmp_path / ".r.json.lock").exists(), "nothing left beside the result"


def test_a_missing_script_is_refused_before_the_file_or_the_device(fake: FakeRunner, tmp_path: Path) -> None:
    """A mistyped script is bad input (exit 2), refused as a bad flag is: the previous answer stays, and the run
    waits for no device. Before the fix it marked the file ``failed`` and waited for the device's lock first (an
    other run's whole tune), only to say then that the script did not exist."""
    from autobatch.run.locks import RunLock

    old = answered_64()
    host = socket.gethostname()
    locks = os.environ["AUTOBATCH_LOCK_DIR"]  # the test's own (conftest), which the fake run's tunes take
    with RunLock.device(f"host-{host}", f"cpu ({host})", folder=locks, command="another tune"):
        code, _, err = run_main("tune", "trian.py", *QUICK, "--lock-timeout", "1")
    assert code == EXIT_USAGE, err
    assert "training script not found:" in err and "trian.py" in err and "waiting for" not in err
    assert json.loads(Path("autobatch-result.json").read_text()) == old  # the previous answer, untouched
