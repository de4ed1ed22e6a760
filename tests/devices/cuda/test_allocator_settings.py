"""The CUDA allocator's settings in effect against those its variables ask for (PYTORCH_CUDA_ALLOC_CONF,
PYTORCH_ALLOC_CONF): recorded in the result, and a warning when they differ.

There is no GPU on the development machines: torch.cuda's calls are stood in for with the figures and the settings
a CUDA build reports (``get_allocator_backend()``, the memory snapshot's ``allocator_settings``), and the probes
are answered by a FakeRunner. Nothing here was run on a GPU. What runs for real: the command, the inventory over a
fake NVML, the probe's device facts (:mod:`autobatch.devices.cuda.runtime`), the budget, and this machine's torch
(a build without CUDA), which reports no setting and must not fail.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from fake_nvml import A, FakeDevice, FakeNvml, GiB, MiB
from support import run_main

from autobatch.cli.state import STATE
from autobatch.devices.backend import backend_for
from autobatch.devices.cuda import runtime
from autobatch.devices.cuda.budget import allocator_mismatches, asked_settings
from autobatch.records.protocol import ProbeOutcome, ProbeRequest
from autobatch.settings import FIELDS
from autobatch.testing import FakeRunner, affine

A10 = "NVIDIA A10"


class CudaProbes(FakeRunner):
    """Answers ``inspect`` on cuda:N with the probe's own device facts (the CUDA backend's, torch.cuda stood in)."""

    def run(self, request: ProbeRequest) -> ProbeOutcome:
        if request.op == "inspect" and request.device.startswith("cuda"):
            facts = backend_for(request.device).facts()
            return ProbeOutcome(kind="fits", info={**self._inspection(), **facts, "cuda_available": True})
        outcome = super().run(request)
        if request.op == "inspect":  # the CPU's inspection, which says whether torch sees CUDA
            outcome.info["cuda_available"] = True
        return outcome


def stand_in_cuda(
    monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any] | None, backend: str = "native"
) -> None:
    """torch.cuda as a CUDA build on an idle 22 GiB card reports it; ``settings``: its snapshot's allocator
    settings (None: a release whose snapshot has none)."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (22 * GiB - 300 * MiB, 22 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: A10)
    monkeypatch.setattr(torch.cuda.memory, "get_allocator_backend", lambda: backend)
    snapshot = {"segments": [], "device_traces": []}
    if settings is not None:
        snapshot["allocator_settings"] = settings
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda *a, **k: snapshot)
    monkeypatch.setattr(runtime, "device_ids", lambda index: (A[4:], None))
    monkeypatch.setattr(runtime, "capabilities", lambda index: {"32-true": None})


@pytest.fixture
def one_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CudaProbes:
    runner = CudaProbes(affine(2 * GiB, 100 * MiB))
    monkeypatch.setattr(STATE, "runner_factory", lambda: runner)
    monkeypatch.setitem(
        sys.modules, "pynvml", FakeNvml([FakeDevice(A, "00000000:17:00.0", name=A10, total=22 * GiB)])
    )
    monkeypatch.chdir(tmp_path)
    for info in FIELDS:
        if info.env not in ("AUTOBATCH_CACHE_DIR", "AUTOBATCH_LOCK_DIR"):
            monkeypatch.delenv(info.env, raising=False)
    for name in ("CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "train.py").write_text("# the fake runner never imports it\n")
    return runner


def tune() -> dict[str, Any]:
    code, out, err = run_main(
        "tune", "train.py", "--device", "cuda:0", "-p", "32-true", "-o", "adamw", "--no-recompute", "--no-cache",
        "--json",
    )  # fmt: skip
    assert code == 0, err
    return dict(json.loads(out))


def warnings_of(result: dict[str, Any]) -> list[str]:
    return [note for note in result["notes"] if note.startswith("warning: ")]


def test_expandable_segments_asked_for_and_not_in_effect_is_reported(one_gpu, monkeypatch):
    # A torch build, platform or driver without expandable segments: the variable asks, the allocator runs without.
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,max_split_size_mb:128")
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128"}
    stand_in_cuda(monkeypatch, {**settings, "expandable_segments": False, "max_split_size": 128 * MiB})
    result = tune()
    assert result["device"]["allocator"] == {"backend": "native", "expandable_segments": False}
    (said,) = [w for w in warnings_of(result) if "expandable" in w]
    assert "PYTORCH_CUDA_ALLOC_CONF asks for expandable_segments:True" in said
    assert "runs without expandable segments" in said


def test_settings_in_effect_as_asked_are_recorded_without_a_warning(one_gpu, monkeypatch):
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    stand_in_cuda(
        monkeypatch, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "expandable_segments": True}
    )
    result = tune()
    assert result["device"]["allocator"] == {"backend": "native", "expandable_segments": True}
    assert not [w for w in warnings_of(result) if "allocator" in w]


def test_an_older_torch_that_reports_no_settings_records_none_and_judges_none(one_gpu, monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    stand_in_cuda(monkeypatch, None)
    monkeypatch.delattr(torch.cuda.memory, "get_allocator_backend")
    result = tune()
    assert "allocator" not in result["device"]
    assert not [w for w in warnings_of(result) if "allocator" in w]


def test_this_machines_torch_without_cuda_reports_nothing_and_does_not_fail():
    assert not torch.cuda.is_available()
    assert runtime.allocator_settings() == {}


def test_cuda_malloc_async_is_not_asked_for_a_snapshot(monkeypatch):
    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("cudaMallocAsync refuses a snapshot")

    monkeypatch.setattr(torch.cuda.memory, "get_allocator_backend", lambda: "cudaMallocAsync")
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", refused)
    assert runtime.allocator_settings() == {"backend": "cudaMallocAsync"}


# --- the comparison (pure) -------------------------------------------------------------------------------


def test_asked_settings_read_the_variables_format():
    conf = "max_split_size_mb:128, roundup_power2_divisions:[256:1,>:2],expandable_segments:False,expandable_segments:True"
    assert asked_settings(conf) == {
        "max_split_size_mb": "128",
        "roundup_power2_divisions": "[256:1,>:2]",
        "expandable_segments": "True",
    }
    assert asked_settings("") == {}


@pytest.mark.parametrize(
    ("asked", "effective", "fragments"),
    [
        ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, {"expandable_segments": True}, []),
        ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, {}, []),  # torch did not say: not judged
        ({}, {"expandable_segments": False, "backend": "native"}, []),
        (
            {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
            {"expandable_segments": False},
            ["asks for expandable_segments:True", "without expandable segments (a torch build"],
        ),
        (  # both set, different: this torch read one of them, the other is not in effect
            {
                "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False",
                "PYTORCH_ALLOC_CONF": "expandable_segments:True",
            },
            {"expandable_segments": False},
            [
                "PYTORCH_ALLOC_CONF asks for expandable_segments:True",
                "the other variable, also set, read first",
            ],
        ),
        ({}, {"expandable_segments": True}, ["which no allocator variable asks for"]),
        (
            {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
            {"backend": "native"},
            ["asks for backend:cudaMallocAsync, but PyTorch's CUDA allocator is native"],
        ),
    ],
)
def test_allocator_mismatches(asked, effective, fragments):
    said = " | ".join(allocator_mismatches(asked, effective))
    assert all(f in said for f in fragments) and bool(said) == bool(fragments), said
