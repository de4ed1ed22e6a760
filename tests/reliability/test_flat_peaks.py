"""A tune whose peaks stay flat while the batch grows says so (issue #10: a make_batch that ignores its
size gave "4096" with nothing flagged; the contract check catches it unless turned off, and then this
warning does)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import run_main

from autobatch.cli.state import STATE
from autobatch.testing import FakeRunner, affine

MiB = 1 << 20


def test_flat_peaks_are_flagged_in_the_notes_and_the_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(STATE, "runner_factory", lambda: FakeRunner(affine(500 * MiB, 0)))
    (tmp_path / "train.py").write_text("# fake\n")
    code, out, err = run_main(
        "tune", "train.py", "--device", "cpu", "--memory", "1GiB", "-p", "32-true", "-o", "sgd",
        "--no-recompute", "--max-batch-size", "4096", "--no-check-batch-size", "--json",
    )  # fmt: skip
    assert code == 0, err
    notes = json.loads(out)["notes"]
    assert any("peaks did not grow with the batch" in n for n in notes)
    assert "does make_batch use its batch_size" in err
