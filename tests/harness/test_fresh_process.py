"""The fresh-process harness on a tiny script: a small batch fits under a generous cap, a batch far above
the cap does not, a broken script is an error, and the harness never imports autobatch."""

from __future__ import annotations

import ast
import os
from pathlib import Path
from types import ModuleType

import psutil
import pytest

from harness import as_is_process, fresh_process
from harness.fresh_process import (
    HarnessError,
    fits,
    fits_ddp,
    largest_fitting,
    run_ddp_trial,
    run_trial,
    torchrun_env,
)

MiB = 1 << 20
#: The width comes from the script's arguments: a batch of n samples holds n x width floats.
TINY = """
import sys

import torch
from torch import nn

WIDTH = int(sys.argv[1])


def build_model():
    return nn.Linear(WIDTH, 1)


def make_batch(batch_size):
    return torch.randn(batch_size, WIDTH), torch.randn(batch_size, 1)


def compute_loss(model, batch):
    inputs, targets = batch
    return ((model(inputs) - targets) ** 2).mean()
"""
WIDE = ["262144"]  # 1 MiB per sample


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.py"
    path.write_text(TINY)
    return path


@pytest.mark.slow
def test_fits_small_and_not_far_above_the_cap(tiny: Path) -> None:
    generous = run_trial(tiny, WIDE, 4, 4096 * MiB, steps=3)
    assert (generous.kind, generous.steps) == ("fits", 3)
    assert generous.baseline_bytes is not None and generous.baseline_bytes > 100 * MiB  # torch is imported
    assert generous.vm_data_end is not None  # the first optimizer step imports torch._dynamo: about 80 MiB
    tight = run_trial(tiny, WIDE, 256, generous.vm_data_end + 64 * MiB, steps=3)  # 256 MiB of batch alone
    assert (tight.kind, tight.steps) == ("oom", 0)
    assert tight.baseline_bytes == pytest.approx(generous.baseline_bytes, rel=0.01)


@pytest.mark.slow
def test_a_broken_script_is_an_error_not_a_verdict(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text(TINY.replace("return nn.Linear(WIDTH, 1)", "raise ValueError('no model here')"))
    with pytest.raises(HarnessError, match="no model here"):
        fits(broken, ["8"], 2, 4096 * MiB, steps=1)


@pytest.mark.parametrize("harness", [fresh_process, as_is_process])
def test_the_harness_does_not_import_autobatch(harness: ModuleType) -> None:
    """Neither harness, nor the program its trial processes run (``CHILD``), imports autobatch's code."""
    source = Path(harness.__file__).read_text()
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert "autobatch" not in imported
    assert "autobatch" not in harness.CHILD


def test_ranks_get_torchruns_environment() -> None:
    env = torchrun_env(1, 2, 29500, "abc")
    assert env["RANK"] == env["LOCAL_RANK"] == "1"
    assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    assert env["OMP_NUM_THREADS"] == os.environ.get("OMP_NUM_THREADS", "1")


@pytest.mark.slow
def test_largest_fitting_bisects_to_the_boundary(tiny: Path) -> None:
    one = run_trial(tiny, WIDE, 1, 4096 * MiB, steps=2)
    assert one.vm_data_end is not None and one.peak_estimate is not None
    budget = one.vm_data_end + 128 * MiB
    # a sample is 1 MiB of input and little else: the boundary lies near the room above batch 1's peak, so a
    # bracket of a dozen batches around it holds it and takes four trials, not the eight of [1, 128]
    near = 1 + (budget - one.peak_estimate) // MiB
    lo, hi = near - 6, near + 6
    found = largest_fitting(tiny, WIDE, budget, lo, hi, steps=2)
    assert lo <= found < hi and found >= 8, (near, found)
    # fresh processes' peaks differ by about 1 MiB from one to the next: the boundary is sharp to a sample or
    # two, not to the sample
    assert fits(tiny, WIDE, found - 2, budget, steps=2)
    assert not fits(tiny, WIDE, found + 3, budget, steps=2)


@pytest.mark.slow
def test_ddp_fits_on_every_rank_or_not_at_all(tiny: Path) -> None:
    trial = run_ddp_trial(tiny, WIDE, 4, 4096 * MiB, world=2, steps=3)
    assert trial.kind == "fits" and [r.steps for r in trial.ranks] == [3, 3]
    assert trial.vm_data_end is not None
    tight = trial.vm_data_end + 96 * MiB
    assert fits_ddp(tiny, WIDE, 4, tight, world=2, steps=3)
    assert not fits_ddp(tiny, WIDE, 256, tight, world=2, steps=3)
    assert psutil.Process().children(recursive=True) == []  # every rank stopped and reaped
