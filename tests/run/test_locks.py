"""One tuner per device: the lock waits and says for whom, times out, and never outlives its holder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autobatch.errors import DeviceError, UsageError
from autobatch.run.locks import RunLock, describe_holder

HOLD = textwrap.dedent(
    """
    import sys, time
    from autobatch.run.locks import RunLock
    lock = RunLock.device("gpu-test", "cuda:0 (test)", folder=sys.argv[1], command="autobatch tune held.py")
    lock.acquire()
    print("held", flush=True)
    time.sleep(600)
    """
)


def holder(folder: Path) -> subprocess.Popen[str]:
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_killed_holder_never_leaves_the_device_locked(tmp_path: Path) -> None:
    proc = holder(tmp_path)
    waits: list[str] = []
    lock = RunLock.device("gpu-test", "cuda:0 (test)", folder=tmp_path, timeout=0.5, on_wait=waits.append)
    with pytest.raises(
        DeviceError, match=r"stayed busy .* held by pid \d+ on .*\(autobatch tune held.py\) since"
    ):
        lock.acquire()
    assert waits and waits[0].startswith("waiting for cuda:0 (test): held by pid")
    proc.send_signal(signal.SIGKILL)  # as an out-of-memory kill or a scheduler would
    proc.wait(10)
    started = time.monotonic()
    with RunLock.device("gpu-test", "cuda:0 (test)", folder=tmp_path, timeout=10) as held:
        assert time.monotonic() - started < 5 and held.holder_path.is_file()
    assert not held.holder_path.exists()


def test_different_devices_do_not_wait_for_each_other(tmp_path: Path) -> None:
    with RunLock.device("gpu-a", "a", folder=tmp_path, timeout=1):
        with RunLock.device("gpu-b", "b", folder=tmp_path, timeout=1):
            pass


def test_an_unusable_lock_folder_warns_and_lets_the_run_go_on(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    warnings: list[str] = []
    with RunLock.device("gpu-a", "cuda:0", folder=tmp_path / "file" / "locks", on_warning=warnings.append):
        pass
    assert len(warnings) == 1 and "probing without the one-tuner-per-device guarantee" in warnings[0]


def test_describe_holder() -> None:
    assert describe_holder({}) == "held by another run (who and since when is not recorded)"
    text = describe_holder(
        {"pid": 7, "host": "n1", "command": "autobatch check t.py", "since": "2026-01-02T03:04:05+00:00"}
    )
    assert text.startswith(
        "held by pid 7 on n1 (autobatch check t.py) since 2026-01-02 03:04:05, "
    ) and text.endswith(" ago")


RESULT_HOLD = textwrap.dedent(
    """
    import sys, time
    from autobatch.run.locks import RunLock
    lock = RunLock.result_file(sys.argv[1], command="autobatch tune other.py")
    lock.acquire()
    print("held", flush=True)
    time.sleep(600)
    """
)


def test_a_result_files_lock_is_the_same_lock_and_leaves_nothing_beside_the_file(tmp_path: Path) -> None:
    """The result file's lock waits, gives up with exit 2 naming its holder, outlives no killed holder, and
    is removed with its holder file when released."""
    root = Path(__file__).resolve().parents[2]
    result = tmp_path / "r.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", RESULT_HOLD, str(result)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        waits: list[str] = []
        with pytest.raises(
            UsageError, match=rf"another run writes the result file {result} \(held by pid {proc.pid}"
        ):
            RunLock.result_file(result, timeout=0.5, on_wait=waits.append).acquire()
        (waiting,) = waits
        assert waiting.startswith(
            f"waiting for the result file {result}, which another run writes: held by pid"
        )
        assert "(autobatch tune other.py)" in waiting
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    with RunLock.result_file(result, timeout=10) as held:
        assert held.path == tmp_path / ".r.json.lock" and held.holder_path.is_file()
    assert sorted(tmp_path.iterdir()) == [], "nothing left beside the result"


def test_a_daemons_command_reports_its_turn_on_the_lock_held_from_running_to_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's log proves no two requests held a device at once only if "running" is reported once the
    lock is held and "released" before it is let go (each stamped as it is reported)."""
    import fcntl
    import json

    from autobatch.records import daemon_events as events

    path = tmp_path / "gpu-test.lock"

    def held_by_us() -> bool:  # another open file description is refused while our lock stands
        with open(path, "a") as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(other, fcntl.LOCK_UN)
            return False

    held_when: dict[str, bool] = {}
    report = events.report

    def watched(state: str, device: str) -> None:
        held_when[state] = held_by_us()
        report(state, device)

    monkeypatch.setattr(events, "report", watched)
    read, write = os.pipe()
    events.attach(write)
    try:
        with RunLock.device("gpu-test", "cuda:0 (test)", folder=tmp_path):
            assert held_by_us()
    finally:
        events._fd.clear()
        os.close(write)
    with os.fdopen(read) as stream:
        reports = [json.loads(line) for line in stream.read().splitlines()]
    assert [r["state"] for r in reports] == ["queued", "running", "released"]
    assert all(r["device"] == "cuda:0 (test)" and r["at"] > 0 for r in reports)
    assert held_when == {"queued": False, "running": True, "released": True} and not held_by_us()
