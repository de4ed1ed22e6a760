"""One FSDP2 rank under fake tensors in torch.distributed's fake process group (``estimate --strategy fsdp``):
what the tracker counts is this rank's shard, about 1/N of one process's parameters, gradients and
optimizer state, not the DTensors' global size.

The fake process group is process-wide (``dist.init_process_group``), so the simulations run in a child
Python (no probe server, no ranks: a few seconds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from support import EXAMPLES, ROOT

WORLD = 4
#: 8 blocks of 256 x 256: 2 MiB of fp32 parameters, every tensor's first dimension divisible by WORLD.
ARGS = ["--width", "256", "--depth", "8", "--tokens", "1", "--in-features", "256", "--classes", "16"]

CHILD = """
import json, sys
from autobatch.step.contract import load_script
from autobatch.explain.pure.records import Scenario
from autobatch.explain.worker.ranks import rank_of
from autobatch.explain.worker.simulate import simulate

path, world, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
script = load_script(path, args)
scenario = Scenario("32-true", "adamw", False)
out = {}
for strategy, size in (("none", 1), ("fsdp", world)):
    rank = rank_of(strategy, size, script, ())
    r = simulate(script, scenario, 64, target="cpu", rank=rank)
    out[strategy] = {"ok": r.ok, "error": r.error, "categories": r.categories, "static": r.static,
                     "tensor_peak": r.tensor_peak, "step_peaks": r.step_peaks}
print(json.dumps(out))
"""


def _simulate() -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(EXAMPLES / "mlp.py"), str(WORLD), *ARGS],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_an_fsdp_rank_holds_about_one_nth_of_the_state_at_its_peak() -> None:
    runs = _simulate()
    single, rank = runs["none"], runs["fsdp"]
    assert single["ok"] and rank["ok"], rank["error"] or single["error"]
    for key in ("parameters", "gradients", "optimizer_state"):  # what the step reports (local_bytes)
        assert abs(rank["static"][key] * WORLD - single["static"][key]) <= 0.02 * single["static"][key]
    # what the tracker counted at the peak: the shards, never a DTensor's global size
    for key in ("parameters", "optimizer_state"):
        tracked, whole = rank["categories"][key], single["static"][key]
        assert abs(tracked * WORLD - whole) <= 0.02 * whole, (key, tracked, whole)
    assert rank["categories"]["gradients"] <= single["static"]["gradients"] / WORLD * 1.02
    # the rank's peak is below one process's by at least the state it does not keep
    saved = sum(single["static"].values()) * (1 - 1 / WORLD)
    assert rank["tensor_peak"] <= single["tensor_peak"] - 0.9 * saved
    # and not below what it must hold: its shards and the batch's activations
    assert rank["tensor_peak"] >= sum(rank["static"].values()) - rank["static"]["gradients"]
