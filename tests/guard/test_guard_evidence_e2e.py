"""The guard's runtime evidence end to end: a tune kept in the cache, a guarded training run of its plan that
runs out of memory once (a real allocator failure, the script's test hook), then the next tune of the same key
(served from the cache) says what the run saw, and ``autobatch cache show`` lists it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, SCRIPTS, run_cli

pytestmark = pytest.mark.slow

SCRIPT = SCRIPTS / "guard" / "guarded_job.py"
#: A cheap tune: one combination, a small budget, at most 16 samples.
TUNE = (
    "tune", str(SCRIPT), "--device", "cpu", "--memory", "512MiB", "-p", "32-true", "-o", "adamw",
    "--no-recompute", "--max-batch-size", "16",
)  # fmt: skip


def test_a_guarded_run_is_evidence_for_the_next_tune_of_its_key(tmp_path: Path) -> None:
    env = {"AUTOBATCH_CACHE_DIR": str(tmp_path / "cache")}
    tuned = run_cli(*TUNE, "--output", str(tmp_path / "r.json"), "--json", env=env)
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    result = json.loads(tuned.stdout)
    key, micro = result["cache"]["key"], result["chosen"]["micro_batch_size"]
    batch = micro * result["chosen"]["accumulation_steps"]  # the per-rank batch the guard splits
    assert not result["cache"]["served"] and micro > 1

    job = subprocess.run(
        [sys.executable, str(SCRIPT), "--result", str(tmp_path / "r.json"), "--steps", "6", "--fail-step", "2",
         "--fail-above", str(micro // 2)],
        cwd=tmp_path, env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert job.returncode == 0 and job.stdout.strip().endswith("done"), job.stderr[-3000:]
    assert "guard: step 2: micro-batch lowered" in job.stderr

    again = run_cli(*TUNE, "--output", str(tmp_path / "r2.json"), "--json", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    served = json.loads(again.stdout)
    assert served["cache"]["served"] and served["cache"]["key"] == key
    (note,) = [n for n in served["notes"] if n.startswith("runtime evidence")]
    assert "the guard held for 6 steps in 1 run(s)" in note
    assert (
        f"ran out of memory at step 2 with shapes [{batch}, 32] [{batch}, 32] (micro-batch {micro} -> "
        in note
    )
    assert "runtime evidence of this tune's jobs" in " ".join(again.stderr.split())

    show = run_cli("cache", "show", key, env=env)
    assert show.returncode == 0, show.stderr
    text = " ".join(show.stderr.split())
    assert f"guard: step 2: micro-batch {micro} -> " in text and "(out of memory) with shapes" in text
    assert f"guard: held for 6 steps (micro-batch {micro} x accumulation {batch // micro}" in text
