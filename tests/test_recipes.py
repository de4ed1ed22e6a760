"""The job-script recipes in scripts/: the shell recipe runs end to end on the CPU device (calibrate,
then train with the plan); the SLURM script is valid bash and its calibration step runs outside SLURM,
served from the cache the shell recipe filled (same script, settings and device)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import EXAMPLES, ROOT

SHELL = ROOT / "scripts" / "calibrate_and_train.sh"
SLURM = ROOT / "scripts" / "slurm" / "train.sbatch"


@pytest.mark.parametrize("recipe", [SHELL, SLURM], ids=["shell", "slurm"])
def test_the_recipes_are_valid_bash(recipe: Path) -> None:
    done = subprocess.run(["bash", "-n", str(recipe)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def environment(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOBATCH_", "SLURM_"))}
    env.update(
        AUTOBATCH=f"{sys.executable} -m autobatch",
        PYTHON=sys.executable,
        PYTHONPATH=str(ROOT),
        NO_COLOR="1",
        AUTOBATCH_DEVICE="cpu",
        AUTOBATCH_MEMORY="400MiB",
        AUTOBATCH_PRECISIONS="32-true",
        AUTOBATCH_OPTIMIZERS="sgd",
        AUTOBATCH_RECOMPUTE="false",
        # the recipes' plumbing is the question, not the maximum: a capped search is two probes and a confirm
        AUTOBATCH_MAX_BATCH_SIZE="16",
        AUTOBATCH_CACHE_DIR=str(tmp_path / "cache"),
        AUTOBATCH_LOCK_DIR=str(tmp_path / "locks"),
        OUT=str(tmp_path / "out"),
        CALIBRATION_DIR=str(tmp_path / "calibration"),
    )
    return env


@pytest.mark.slow
def test_shell_recipe_trains_with_the_plan_and_slurm_calibration_runs_outside_slurm(tmp_path: Path) -> None:
    env = environment(tmp_path)
    script = str(EXAMPLES / "mlp.py")
    shell = subprocess.run(
        ["bash", str(SHELL), script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert shell.returncode == 0, shell.stderr
    result = json.loads((tmp_path / "out" / "autobatch-result.json").read_text())
    micro = result["chosen"]["micro_batch_size"]
    assert result["status"] == "complete" and result["probes"] > 0
    assert (
        f"micro-batch {micro}\n" in shell.stdout and "step 2: loss" in shell.stdout
    )  # the training ran the plan
    assert f"training: micro-batch {micro} x accumulation 1 x 1 process(es)" in shell.stderr

    started = time.monotonic()
    slurm = subprocess.run(
        ["bash", str(SLURM), "--calibrate-only", script],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    took = time.monotonic() - started
    assert slurm.returncode == 0, slurm.stderr
    (folder,) = (tmp_path / "calibration").iterdir()
    assert folder.name.startswith("cpu-")
    assert {p.name for p in folder.iterdir()} >= {"autobatch.env", "ds_config.json", "autobatch-result.json"}
    assert f"export AUTOBATCH_MICRO_BATCH_SIZE={micro}" in (folder / "autobatch.env").read_text()
    assert (
        "served from the cache" in slurm.stderr
        and f"plan for {folder.name} (none): micro-batch {micro}" in slurm.stderr
    )
    assert took < 30, f"a cached calibration took {took:.1f} s"


@pytest.mark.slow
def test_slurm_calibration_measures_the_jobs_strategy(tmp_path: Path) -> None:
    """STRATEGY=fsdp: every probe runs the node's ranks under FSDP2 (2 gloo ranks here, GPUS_PER_NODE=2),
    and the calibration writes accelerate's FSDP config instead of DeepSpeed's."""
    env = environment(tmp_path) | {"STRATEGY": "fsdp", "GPUS_PER_NODE": "2", "AUTOBATCH_MEMORY": "500MiB"}
    done = subprocess.run(
        ["bash", str(SLURM), "--calibrate-only", str(EXAMPLES / "mlp.py"), "--", "--width", "128", "--depth", "4"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (folder,) = (tmp_path / "calibration").iterdir()
    assert {p.name for p in folder.iterdir()} == {"autobatch.env", "accelerate.yaml", "autobatch-result.json"}
    result = json.loads((folder / "autobatch-result.json").read_text())
    chosen = result["chosen"]
    assert (chosen["strategy"], chosen["nproc_per_node"], chosen["world_size"]) == ("fsdp", 2, 2)
    assert "distributed_type: FSDP" in (folder / "accelerate.yaml").read_text()
    assert f"plan for {folder.name} (fsdp): micro-batch {chosen['micro_batch_size']}" in done.stderr
