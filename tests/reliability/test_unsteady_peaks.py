"""A peak that is not the batch's alone is named, through the real command on real scripts on the CPU device
(issue "Answers that hold in the job, round two", parts 3 and 4; the rules: autobatch.core.step_peaks).

Before the fix, under ``--device cpu --memory 1GiB --precision 32-true --optimizer adamw --no-cache``:

* ``varying_length.py`` (``make_batch`` draws a sequence length per call with ``torch.randint``): exit 0,
  micro-batch 690, no warning; every probe forked from one server drew the same length, and 5 of 5
  ``check --batch-size 690 --steps 30`` ran out of memory.
* ``leaks_activations.py`` (``compute_loss`` appends each step's activations to a global list): every
  confirmation failed and the tune exited 4, "no combination fits even the smallest batch".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import SCRIPTS, run_cli

from autobatch.errors import EXIT_LEAK

ISSUE = ("--device", "cpu", "--memory", "1GiB", "--precision", "32-true", "--optimizer", "adamw", "--no-cache")  # fmt: skip


@pytest.mark.slow
def test_a_peak_that_depends_on_the_data_is_named_in_the_notes_and_a_warning(tmp_path: Path) -> None:
    done = run_cli(
        "tune", str(SCRIPTS / "bad" / "varying_length.py"), *ISSUE, "--no-recompute", "--max-batch-size", "64",
        "--output", str(tmp_path / "r.json"), "--json", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    notes = json.loads(done.stdout)["notes"]
    named = [n for n in notes if "the peak depends on the data" in n]
    assert named and "make_batch must return the worst case" in named[0]
    assert "make_batch(8) returned batches of different shapes" in named[0]
    err = " ".join(done.stderr.split())
    assert "warning: 32-true/adamw/no-recompute: the peak depends on the data" in err


@pytest.mark.slow
def test_a_leak_is_named_with_its_own_exit_code_not_nothing_fits(tmp_path: Path) -> None:
    done = run_cli(
        "tune", str(SCRIPTS / "bad" / "leaks_activations.py"), *ISSUE, "--no-recompute",
        "--output", str(tmp_path / "r.json"), cwd=tmp_path,
    )  # fmt: skip
    err = " ".join(done.stderr.split())
    assert done.returncode == EXIT_LEAK, err
    assert "the step's peak grew at every step from step 3 to step" in err and "per step" in err
    assert "no combination fits" not in err
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["status"] == "failed" and saved["chosen"] is None
    assert any("grew at every step" in note for note in saved["notes"])
