"""A script that runs code at import (data prepared with torch, a pool, a helper process in its own
session) is tuned as it is: no user code runs in the process the probes are forked from, and nothing the
script starts outlives the tune (slow: the real command on the CPU device)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import psutil
import pytest
from support import run_cli

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import multiprocessing, os, subprocess, sys
    import torch
    from torch import nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    X = torch.randn(60000, 192)
    X = (X - X.mean(0)) / X.std(0)     # standardised at import: starts OpenMP's thread pool here
    Y = torch.randint(0, 10, (60000,))
    POOL = multiprocessing.Pool(2)     # a pool at import, as loaders sometimes do
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    with open(os.environ["HELPERS"], "a") as pids:
        pids.write(f"{helper.pid}\\n")


    def build_model():
        return nn.Sequential(nn.Linear(192, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


    def make_batch(batch_size):
        index = torch.randint(0, X.shape[0], (batch_size,))
        return X[index], Y[index]


    def compute_loss(model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y)
    """
)
QUICK = ("--device", "cpu", "--memory", "540MiB", "-p", "32-true", "-o", "adamw", "--no-recompute")


def test_a_script_that_runs_code_at_import_is_tuned_and_leaves_nothing_behind(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text(SCRIPT)
    helpers = tmp_path / "helpers.txt"  # outside the job's folder, which probes do not write into
    env = {"HELPERS": str(helpers)}
    proc = run_cli(
        "tune",
        "train.py",
        *QUICK,
        "--no-cache",
        "--timeout",
        "60",
        "--json",
        cwd=job,
        env=env,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr
    (combo,) = json.loads(proc.stdout)["combinations"]
    top = combo["max_batch_size"]
    assert combo["status"] == "exact" and top > 8, combo
    check = run_cli("check", "train.py", *QUICK, "-b", str(top), cwd=job, env=env, timeout=200)
    assert check.returncode == 0, check.stderr  # the maximum holds in a check of its own

    started = [int(line) for line in helpers.read_text().split()]
    assert len(started) >= 3  # the script was imported by the contract check and by every probe
    alive = [pid for pid in started if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert alive == [], f"processes the script started outlived the tune: {alive}"
    assert os.environ.get("HELPERS") is None  # the test's variable stayed in the children
