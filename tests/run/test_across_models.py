"""Several GPU models on one node: one tune per model, one plan with the smallest maximum.

The NVML data is injected (tests/fake_nvml.py stands in for pynvml) and the probes answered by a
FakeRunner that plays a CUDA device of each model's memory: no GPU is involved, and none is claimed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from fake_nvml import A, B, FakeDevice, FakeNvml, GiB, MiB, proc
from support import run_main

from autobatch.cli.state import STATE
from autobatch.records.protocol import ProbeOutcome, ProbeRequest
from autobatch.records.result import ComboResult, TuneResult
from autobatch.run.across_models import merge_models
from autobatch.run.options import TuneOptions
from autobatch.settings import FIELDS, Settings
from autobatch.testing import FakeRunner, affine

C = "GPU-cccccccc-1111-2222-3333-444444444444"
A100, V100 = "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB"


def node() -> FakeNvml:
    return FakeNvml(
        [
            FakeDevice(A, "00000000:17:00.0", name=A100),
            FakeDevice(B, "00000000:65:00.0", name=A100),
            FakeDevice(
                C,
                "00000000:CA:00.0",
                name=V100,
                total=32 * GiB,
                used=4 * GiB,
                procs=[proc(4_000_000, 4 * GiB)],
            ),
        ]
    )


class CudaFake(FakeRunner):
    """Answers ``inspect`` as the CUDA devices of :func:`node` (cuda:N in PCI order)."""

    def run(self, request: ProbeRequest) -> ProbeOutcome:
        if request.op == "inspect" and request.device.startswith("cuda"):
            self.requests.append(request)
            index = int(request.device.split(":")[1])
            device = node().devices[index]
            info = {**self._inspection(), "snapshot": {
                "device_index": index, "name": device.name, "total_bytes": device.total,
                "free_bytes": device.total - device.used - 512 * MiB, "nvml_used_by_others_bytes": device.used,
                "context_bytes": 512 * MiB, "context_source": "nvml", "uuid": device.uuid,
            }}  # fmt: skip
            return ProbeOutcome(kind="fits", info=info)
        outcome = super().run(request)
        if request.op == "inspect":
            outcome.info["cuda_available"] = True
        return outcome


@pytest.fixture
def gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CudaFake:
    runner = CudaFake(affine(2 * GiB, 100 * MiB))
    monkeypatch.setattr(STATE, "runner_factory", lambda: runner)
    monkeypatch.setitem(sys.modules, "pynvml", node())
    monkeypatch.chdir(tmp_path)
    for info in FIELDS:
        if info.env not in ("AUTOBATCH_CACHE_DIR", "AUTOBATCH_LOCK_DIR"):
            monkeypatch.delenv(info.env, raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (tmp_path / "train.py").write_text("# the fake runner never imports it\n")
    return runner


def tune(*extra: str) -> tuple[int, dict, str]:
    code, out, err = run_main(
        "tune", "train.py", "-p", "32-true", "-o", "adamw", "--no-recompute", "--json", *extra
    )
    return code, (json.loads(out) if out.strip() else {}), err


def test_one_tune_per_model_and_the_plan_takes_the_smallest_maximum(gpus: CudaFake) -> None:
    code, result, err = tune("--global-batch-size", "1024", "--world-size", "3")
    assert code == 0, err
    tuned = sorted({r.device for r in gpus.requests if r.op == "probe"})
    assert tuned == ["cuda:0", "cuda:2"], "one device per model: cuda:1 is an A100 like cuda:0"
    models = {d["model"].split(" (")[0]: d for d in result["devices"]}
    a100, v100 = models[A100]["max_batch_sizes"], models[V100]["max_batch_sizes"]
    key = "32-true/adamw/no-recompute"
    assert v100[key] < a100[key]
    assert result["combinations"][0]["max_batch_size"] == v100[key]
    chosen = result["chosen"]
    assert chosen["micro_batch_size"] <= v100[key] and chosen["world_size"] == 3
    assert chosen["micro_batch_size"] * chosen["accumulation_steps"] * 3 == chosen["global_batch_size"]
    assert models[A100]["indices"] == [0, 1] and models[V100]["indices"] == [2]
    assert result["device"]["name"] == "cuda:2"  # the binding model's budget
    assert "GPU model 1 of 2" in err and "GPU model 2 of 2" in err
    # memory another process holds on the V100: subtracted, recorded, warned about
    assert "other processes hold 4.00 GiB on cuda:2" in err
    assert any("other processes hold" in note for note in result["notes"])


def test_both_models_are_served_from_the_cache_on_a_rerun(gpus: CudaFake) -> None:
    assert tune()[0] == 0
    asked = len(gpus.requests)
    code, again, err = tune()
    assert code == 0, err
    assert len(gpus.requests) == asked
    assert all(d["served_from_cache"] for d in again["devices"])


def test_naming_one_device_tunes_only_its_model(gpus: CudaFake) -> None:
    code, result, err = tune("--device", "cuda:1")
    assert code == 0, err
    assert {r.device for r in gpus.requests if r.op == "probe"} == {"cuda:1"}
    assert "devices" not in result and result["device"]["name"] == "cuda:1"


def combo(
    max_batch: int | None, status: str = "exact", sps: float | None = 100.0, opt: str = "adamw"
) -> ComboResult:
    return ComboResult(
        "32-true", opt, False, status=status, max_batch_size=max_batch, samples_per_second=sps, probes=3
    )


def result_of(*combos: ComboResult, name: str = "cuda:0") -> TuneResult:
    return TuneResult(
        "train.py",
        [],
        {"type": "cuda", "name": name, "budget_bytes": GiB},
        "throughput",
        list(combos),
        probes=3,
    )


def test_merge_takes_the_smallest_maximum_the_slowest_speed_and_any_infeasibility() -> None:
    from autobatch.devices.selection import Target

    targets = [
        Target(f"cuda:{i}", f"cuda:{i}", f"gpu-{i}", {}, model=m) for i, m in enumerate(("big", "small"))
    ]
    fast_big = result_of(combo(300, sps=900.0), combo(120, opt="sgd"))
    slow_small = result_of(combo(200, sps=400.0), combo(None, "infeasible", opt="sgd"), name="cuda:1")
    merged = merge_models(
        [fast_big, slow_small], targets, TuneOptions.from_settings(Settings(), 1, "default")
    )
    first, second = merged.combinations
    assert (
        first.max_batch_size == 200
        and first.samples_per_second == 400.0
        and "small 200" in (first.reason or "")
    )
    assert (
        second.max_batch_size is None and second.status == "infeasible" and second.reason.startswith("small")
    )
    assert merged.chosen is not None and merged.chosen.micro_batch_size == 200
    assert merged.device["name"] == "cuda:1" and merged.probes == 6
