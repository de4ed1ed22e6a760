"""The confirmation spends its steps only while they can change the answer, through the real command.

A confirmation runs the six steps the leak rule reads, then stops at the first step whose peak held still
(up to ``confirm_steps``). Before, it ran ten steps every time: on the MLP example under 420 MiB the
maximum's probe ran 10 steps. The maximum still holds ten steps in a fresh process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import EXAMPLES, run_cli

pytestmark = pytest.mark.slow

FLAGS = ("--device", "cpu", "--memory", "420MiB", "--precision", "32-true", "--optimizer", "adamw",
         "--no-recompute")  # fmt: skip


def test_the_confirmation_stops_once_its_peak_holds_still_and_the_maximum_holds_ten_steps(
    tmp_path: Path,
) -> None:
    script = str(EXAMPLES / "mlp.py")
    out = str(tmp_path / "r.json")
    done = run_cli("tune", script, *FLAGS, "--no-cache", "--json", "--output", out, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (combo,) = json.loads(done.stdout)["combinations"]
    top = combo["max_batch_size"]
    longest = max(p["steps"] for p in combo["trace"] if p["batch_size"] == top and p["kind"] == "fits")
    assert 6 <= longest < 10, combo["trace"]
    assert all(p["kind"] != "fits" for p in combo["trace"] if p["batch_size"] > top)

    # The answer holds the ten steps the confirmation ran before, in a fresh process (the next batch's failure:
    # tests/cli/test_e2e.py).
    check = run_cli(
        "check", script, *FLAGS, "--batch-size", str(top), "--steps", "10", "--json", cwd=tmp_path
    )
    report = json.loads(check.stdout)
    assert report["fits"] is True and report["steps"] == 10, report
