"""``--strategy`` and ``--nproc-per-node`` on ``tune`` and ``check``, through a fake probe runner: the
requests carry the strategy, the plan's world is nproc x nodes, the result and the configs name it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import run_main, wire_fake_runner

from autobatch.errors import EXIT_USAGE
from autobatch.testing import FakeRunner, affine

MiB = 1 << 20


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeRunner:
    runner = wire_fake_runner(FakeRunner(affine(400 * MiB, 1.7 * MiB)), tmp_path, monkeypatch, keep=())
    for name in ("WORLD_SIZE", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_NTASKS", "SLURM_GPUS_ON_NODE"):
        monkeypatch.delenv(name, raising=False)
    return runner


def test_tune_with_a_strategy_probes_every_rank_and_plans_for_the_world(fake: FakeRunner) -> None:
    code, out, err = run_main(
        "tune", "train.py", "-d", "cpu", "-m", "1GiB", "-p", "32-true", "-o", "adamw", "--no-recompute",
        "--strategy", "fsdp", "--nproc-per-node", "2", "--nnodes", "3", "--no-cache", "--json",
        "--emit", "accelerate",
    )  # fmt: skip
    assert code == 0, err
    result = json.loads(out)
    probes = [r for r in fake.requests if r.op == "probe"]
    assert probes and all((r.strategy, r.nproc_per_node) == ("fsdp", 2) for r in probes)
    assert all(r.strategy == "none" for r in fake.requests if r.op == "inspect")
    assert result["distributed"]["strategy"] == "fsdp" and result["distributed"]["blocks"] == ["Block"]
    chosen = result["chosen"]
    assert (chosen["strategy"], chosen["nproc_per_node"], chosen["num_nodes"], chosen["world_size"]) == (
        "fsdp", 2, 3, 6,
    )  # fmt: skip
    assert "worst rank" in err
    assert "distributed_type: FSDP" in Path("accelerate_config.yaml").read_text()


def test_an_explicit_world_size_wins_over_nproc_times_nodes(fake: FakeRunner) -> None:
    code, out, err = run_main(
        "tune", "train.py", "-d", "cpu", "-m", "1GiB", "-p", "32-true", "-o", "adamw", "--no-recompute",
        "--strategy", "ddp", "--nproc-per-node", "2", "--world-size", "8", "--no-cache", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["chosen"]["world_size"] == 8


def test_a_strategy_needs_two_ranks_and_a_known_name(fake: FakeRunner) -> None:
    code, _, err = run_main("check", "train.py", "-d", "cpu", "-m", "1GiB", "-b", "8", "--strategy", "ddp")
    assert code == EXIT_USAGE and "--nproc-per-node 2" in err
    code, _, err = run_main("check", "train.py", "-b", "8", "--strategy", "zero3", "--nproc-per-node", "2")
    assert code != 0 and "strategy" in err and "none, ddp, fsdp" in err
    assert not [r for r in fake.requests if r.op == "probe"]


def test_check_json_carries_the_strategy(fake: FakeRunner) -> None:
    code, out, err = run_main(
        "check", "train.py", "-d", "cpu", "-m", "1GiB", "-b", "8", "--strategy", "ddp", "--nproc-per-node", "2",
        "--json",
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert "rank_peak_bytes" in report and report["failed_rank"] is None
    assert [r.strategy for r in fake.requests if r.op == "probe"] == ["ddp"]
