"""A strategy tune's first probe from the single-process probes in the journal (autobatch.run.rank_priors),
end to end through ``tune`` with a fake runner whose memory curve depends on the strategy: no torch."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import run_main, wire_fake_runner

from autobatch.core.rank_prior import GLOO_RANK_BYTES
from autobatch.records.protocol import ProbeOutcome, ProbeRequest
from autobatch.testing import Curve, FakeRunner, plateau

MiB = 1 << 20
BLOCK = (4096, 4096)  # 4 blocks of 16 M parameters: 256 MiB of fp32 parameters in all
# The optimizer step's flat peak (parameters, gradients, AdamW state and its temporaries) until the forward and
# backward's activations overtake it: baseline, parameters + gradients + AdamW state, the rest, per sample.
SINGLE = plateau(2000 * MiB, (300 + 1024 + 50) * MiB, 1.7 * MiB)
# One FSDP rank on 2: half the sharded 1 GiB, one gathered block with its gradients (128 MiB), the process
# group's runtime, and 10 MiB that the prediction does not know of.
RISING = SINGLE.intercept - 512 * MiB + 128 * MiB + GLOO_RANK_BYTES + 10 * MiB
FSDP = plateau(SINGLE.flat - 512 * MiB, RISING, 1.7 * MiB)
ARGS = ("tune", "train.py", "-d", "cpu", "-m", "4GiB", "-p", "32-true", "-o", "adamw", "--no-recompute")
STRATEGY = ("--strategy", "fsdp", "--nproc-per-node", "2", "--json")


@dataclass
class StrategyRunner(FakeRunner):
    """A fake runner whose curve is the single-process one, or one FSDP rank's on a strategy request."""

    rank_curve: Curve = FSDP

    def _inspection(self) -> dict[str, object]:
        return {**super()._inspection(), "block_params": [BLOCK[0] * BLOCK[1]] * len(self.param_shapes)}

    def _probe(self, request: ProbeRequest) -> ProbeOutcome:
        if request.strategy == "none":
            return super()._probe(request)
        curve, self.curve = self.curve, self.rank_curve
        try:
            return super()._probe(request)
        finally:
            self.curve = curve


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StrategyRunner:
    runner = StrategyRunner(SINGLE, param_shapes=(BLOCK,) * 4)
    monkeypatch.setenv("AUTOBATCH_CACHE_DIR", str(tmp_path / "cache"))
    wire_fake_runner(runner, tmp_path, monkeypatch, keep=("AUTOBATCH_CACHE_DIR", "AUTOBATCH_LOCK_DIR"))
    for name in ("WORLD_SIZE", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_NTASKS", "SLURM_GPUS_ON_NODE"):
        monkeypatch.delenv(name, raising=False)
    return runner


def first_and_probes(out: str) -> tuple[int, int, dict[str, object]]:
    result = json.loads(out)
    combo = result["combinations"][0]
    return combo["trace"][0]["batch_size"], combo["probes"], result


def test_the_first_fsdp_probe_lands_at_the_boundary_the_single_process_curve_predicts(
    fake: StrategyRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # without the single-process curve (an empty cache), the search starts at the scout
    code, out, err = run_main(*ARGS, *STRATEGY)
    assert code == 0, err
    scout_first, scout_probes, result = first_and_probes(out)
    boundary = result["combinations"][0]["max_batch_size"]  # type: ignore[index]
    assert scout_first < boundary / 10
    assert "single-process curve" not in err

    monkeypatch.setenv("AUTOBATCH_CACHE_DIR", str(tmp_path / "with-single"))
    code, out, err = run_main(*ARGS, "--strategy", "none")
    assert code == 0, err
    code, out, err = run_main(*ARGS, *STRATEGY)
    assert code == 0, err
    first, probes, result = first_and_probes(out)
    assert result["combinations"][0]["max_batch_size"] == boundary  # type: ignore[index]
    assert abs(first - boundary) <= 0.02 * boundary and probes < scout_probes
    assert "prior from the single-process curve, sharded state / 2" in err
    notes = [n for n in result["notes"] if "single-process curve" in n]  # type: ignore[attr-defined]
    assert notes and notes[0].startswith("32-true/adamw/no-recompute: first probe near batch")


def test_what_crosses_strategies_is_the_curve_never_the_answer(fake: StrategyRunner) -> None:
    """The stored result of one strategy is not served to a tune with another on as many ranks (same world
    size): each rank's memory differs."""
    code, out, err = run_main(*ARGS, *STRATEGY)
    assert code == 0, err
    code, out, err = run_main(*ARGS, "--strategy", "ddp", "--nproc-per-node", "2", "--json")
    assert code == 0, err
    assert "served from the cache" not in err
    assert json.loads(out)["distributed"]["strategy"] == "ddp"
    assert any(r.strategy == "ddp" for r in fake.requests)
