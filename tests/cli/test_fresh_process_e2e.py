"""On the CPU device a maximum holds in the job's fresh process (issue: answers that hold, round two, 7).

``autobatch tune`` probes in processes forked from its probe server; the job's processes are fresh. Each
maximum here is checked with the independent harness of ``tests/harness/fresh_process.py`` (no autobatch
code: a fresh ``python`` under ``RLIMIT_DATA`` set before ``exec``, or ranks started as ``torchrun``
starts them), at the budget the tune reports: at most the harness's own maximum and within 3 % below it, that is, the
harness fits ``max`` (10 steps) and does not fit ``floor(max / 0.97) + 1``; a DDP maximum on 2 ranks holds
in fresh rank processes at 98 % of it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness.fresh_process import fits, fits_ddp
from support import EXAMPLES, SCRIPTS

pytestmark = pytest.mark.slow


def _tune(tmp_path: Path, script: Path, memory: str, *extra: str) -> tuple[int, int, dict[str, object], str]:
    """The tune's maximum, its budget, its device record and what it told the user (white space folded). The
    job's fresh processes, started beside the probe server, leave no temporary folder behind."""
    result, temp = tmp_path / "result.json", tmp_path / "tmp"
    temp.mkdir()
    command = [
        sys.executable, "-m", "autobatch", "tune", str(script), "--device", "cpu", "--memory", memory,
        "-p", "32-true", "-o", "adamw", "--no-recompute", "--no-cache", "--output", str(result), *extra,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "AUTOBATCH_FRESH_BASELINE"}  # the default: measured
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=1200, env={**env, "TMPDIR": str(temp)}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert [p.name for p in temp.iterdir() if p.name.startswith(("autobatch-", "scratch-"))] == []
    data = json.loads(result.read_text())
    (combination,) = data["combinations"]
    told = " ".join(done.stderr.split())
    return int(combination["max_batch_size"]), int(data["device"]["budget_bytes"]), data["device"], told


def test_a_ddp_maximum_holds_in_fresh_rank_processes(tmp_path: Path) -> None:
    script = EXAMPLES / "mlp.py"  # its steps are short enough for a distributed search in a test
    maximum, budget, device, _told = _tune(
        tmp_path, script, "512MiB", "--strategy", "ddp", "--nproc-per-node", "2"
    )
    assert len(device["fresh_process"]["offset_bytes"]) == 2  # type: ignore[index]
    assert fits_ddp(script, [], math.floor(0.98 * maximum), budget, world=2)


def test_a_maximum_near_a_small_cap_holds_in_the_jobs_first_steps(tmp_path: Path) -> None:
    # the ViT: a forked probe answered 373 under 1 GiB where a fresh process fits 369 (+1.1 %); the 33 M-parameter
    # MLP's run (three minutes here) is in scripts/fresh_process.py and docs/measurements/fresh-process.md.
    # Under 768 MiB the same offset weighs more: the answer ran out of memory in the job's second step (222,
    # then 213 with the offset read right), as long as the probes started torch's thread pool ahead of the
    # steps and the job did not. One tune answers both: it holds 10 steps, and lies within 3 % of the boundary.
    script = SCRIPTS / "vit_small.py"
    maximum, budget, device, told = _tune(tmp_path, script, "768MiB")
    assert len(device["fresh_process"]["offset_bytes"]) == 1  # type: ignore[index]
    assert "probes count as the job's fresh process" in told and "against a probe forked" in told, told[
        -3000:
    ]
    assert fits(script, [], maximum, budget), "the answer does not hold 10 steps in the job's fresh process"
    assert not fits(script, [], math.floor(maximum / 0.97) + 1, budget), "more than 3 % below it"


def test_the_jobs_fresh_process_is_measured_once_and_kept_for_the_next_command(tmp_path: Path) -> None:
    """A check measures the job's fresh process and keeps it in the cache; the next tune of the same script
    measures only the forked half on its own server and counts against the kept one; --refresh measures both."""
    script, cache = EXAMPLES / "mlp.py", tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k != "AUTOBATCH_FRESH_BASELINE"}
    env["AUTOBATCH_CACHE_DIR"] = str(cache)
    common = ["--device", "cpu", "--memory", "512MiB", "-p", "32-true", "-o", "sgd"]
    check = [sys.executable, "-m", "autobatch", "check", str(script), "--batch-size", "4", "--steps", "3"]
    done = subprocess.run([*check, *common], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    (kept,) = cache.glob("*.fresh.json")
    made = json.loads(kept.read_text())["made"]

    def tune(*extra: str) -> tuple[dict[str, object], str]:
        result = tmp_path / "result.json"
        command = [
            sys.executable, "-m", "autobatch", "tune", str(script), *common, "--no-recompute",
            "--max-batch-size", "8", "--output", str(result), *extra,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(result.read_text())["device"]["fresh_process"], " ".join(done.stderr.split())

    fresh, told = tune()
    assert fresh["kept"] == made and "fresh_settled_bytes" not in fresh, fresh
    assert f"the fresh process as measured at {made} and kept in the cache" in told, told[-3000:]
    fresh, told = tune("--refresh")
    assert "kept" not in fresh and len(fresh["fresh_settled_bytes"]) == 1, fresh  # type: ignore[arg-type]
    # the CPU device with its memory given: the job's fresh process ran while the probe server started
    assert fresh["beside_server"] is True, fresh
    assert "measured once per run" in told
    assert json.loads(kept.read_text())["made"] >= made  # replaced by the measurement --refresh made
