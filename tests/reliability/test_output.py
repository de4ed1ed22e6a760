"""Bad output paths and a full disk (issue #10): named before probing, or after the answer is shown.

Before the fix they were "internal error" (exit 1), and on a full disk the finished tune's answer was
never printed.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from support import run_main

from autobatch.cli.state import STATE
from autobatch.errors import EXIT_USAGE
from autobatch.settings import FIELDS
from autobatch.testing import FakeRunner, affine

MiB = 1 << 20


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeRunner:
    runner = FakeRunner(affine(400 * MiB, 1.7 * MiB))
    monkeypatch.setattr(STATE, "runner_factory", lambda: runner)
    monkeypatch.chdir(tmp_path)
    for info in FIELDS:
        if info.env != "AUTOBATCH_LOCK_DIR":  # the test's own lock folder (conftest): never another run's
            monkeypatch.delenv(info.env, raising=False)
    monkeypatch.setenv("AUTOBATCH_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "train.py").write_text("# the fake runner never imports it\n")
    return runner


def tune(*extra: str) -> tuple[int, str]:
    code, _, err = run_main(
        "tune", "train.py", "--device", "cpu", "--memory", "1GiB", "-p", "32-true", "--no-recompute", *extra
    )
    return code, err


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda d: (d / "out").mkdir() or d / "out", "is a folder"),
        (lambda d: (d / "file").write_text("x") and d / "file" / "r.json", "is a file, not a folder"),
    ],
    ids=["output-is-a-folder", "parent-is-a-file"],
)
def test_a_bad_output_path_is_named_before_any_probe(fake: FakeRunner, tmp_path: Path, make, words) -> None:  # type: ignore[no-untyped-def]
    code, err = tune("--output", str(make(tmp_path)))
    assert code == EXIT_USAGE, err
    assert words in err and "--output" in err
    assert fake.requests == []  # nothing was probed


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_folder_is_named_before_any_probe(fake: FakeRunner, tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    code, err = tune("--output", str(folder / "r.json"))
    assert code == EXIT_USAGE and "not writable" in err


def test_an_output_under_proc_is_named_before_any_probe(fake: FakeRunner) -> None:
    code, err = tune("--output", "/proc/autobatch-result.json")
    assert code == EXIT_USAGE, err
    assert "/proc is not writable" in err and fake.requests == []


def test_a_full_disk_shows_the_answer_names_the_fix_and_keeps_the_old_file(
    fake: FakeRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = tmp_path / "autobatch-result.json"
    old.write_text('{"previous": true}\n')

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("autobatch.records.files.os.fsync", full)
    code, err = tune()
    assert code == EXIT_USAGE, err
    assert "chosen" in err and "micro-batch" in err  # the answer, before the error
    assert err.index("chosen") < err.index("disk is full")
    assert "free space" in err and "--output" in err
    assert old.read_text() == '{"previous": true}\n'
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
