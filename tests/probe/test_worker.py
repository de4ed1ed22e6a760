"""The probe worker's CUDA verdict: allocator stats and NVML's figure judged against the request.

No GPU here. The verdict is a pure function, fed injected stats; the CUDA backend runs with
torch.cuda's calls replaced and a fake pynvml, to show that the figure NVML reports for the probe's
device reaches the verdict together with the limit the session put in the request.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from fake_nvml import A, B, FakeDevice, FakeNvml, GiB, MiB, proc
from requesting import probe_request
from support import session_settings

from autobatch.core.space import Combo
from autobatch.devices.backend import backend_for
from autobatch.devices.budget import device_info
from autobatch.devices.cuda import runtime
from autobatch.devices.cuda.backend import cuda_verdict
from autobatch.devices.cuda.budget import CudaSnapshot, CudaStepStats, cuda_budget
from autobatch.records.protocol import ProbeOutcome, ProbeRequest
from autobatch.run.session import Session
from autobatch.step.spec import ScriptSpec

LIMIT = 70 * GiB


def cuda_request(**kw: object) -> ProbeRequest:
    values: dict[str, object] = dict(
        batch_size=8,
        precision="32-true",
        optimizer="adamw",
        device="cuda:0",
        budget_bytes=60 * GiB,
        process_limit_bytes=LIMIT,
        min_steps=3,
        max_steps=8,
        timeout=60.0,
    )
    values.update(kw)
    return probe_request(**values)  # type: ignore[arg-type]


def fits() -> ProbeOutcome:
    return ProbeOutcome(kind="fits", batch_size=8)


# --- the decision -------------------------------------------------------------------------------


def test_nvml_figure_over_the_limit_turns_a_fit_into_an_oom():
    stats = CudaStepStats(40 * GiB, 50 * GiB, nvml_process_bytes=LIMIT + MiB)
    kind, reason = cuda_verdict(fits(), stats, cuda_request())
    assert kind == "oom"
    assert "NVML" in (reason or "") and "over the 70.00 GiB the device leaves it" in (reason or "")


def test_nvml_figure_under_the_limit_stays_a_fit():
    stats = CudaStepStats(40 * GiB, 50 * GiB, nvml_process_bytes=LIMIT - MiB)
    assert cuda_verdict(fits(), stats, cuda_request()) == ("fits", None)


def test_no_limit_in_the_request_means_no_nvml_rule():
    stats = CudaStepStats(40 * GiB, 50 * GiB, nvml_process_bytes=LIMIT + MiB)
    assert cuda_verdict(fits(), stats, cuda_request(process_limit_bytes=None)) == ("fits", None)


@pytest.mark.parametrize(
    ("stats", "kind", "fragment"),
    [
        (CudaStepStats(40 * GiB, 50 * GiB, num_alloc_retries=1), "oom", "num_alloc_retries=1"),
        (CudaStepStats(40 * GiB, 50 * GiB, num_ooms=2), "oom", "num_ooms=2"),
        (CudaStepStats(40 * GiB, 61 * GiB), "oom", "over the budget"),
        (CudaStepStats(40 * GiB, 50 * GiB), "fits", None),
    ],
)
def test_without_an_nvml_figure_the_other_rules_still_apply(stats, kind, fragment):
    assert stats.nvml_process_bytes is None
    got, reason = cuda_verdict(fits(), stats, cuda_request())
    assert got == kind
    assert reason is None if fragment is None else fragment in (reason or "")


def test_a_probe_that_did_not_fit_keeps_its_kind_and_reason():
    oom = ProbeOutcome(kind="oom", reason="CUDA out of memory")
    clean = CudaStepStats(GiB, GiB)
    assert cuda_verdict(oom, clean, cuda_request()) == ("oom", "CUDA out of memory")
    assert cuda_verdict(ProbeOutcome(kind="error"), clean, cuda_request()) == ("error", None)


# --- the worker's CUDA branch, torch.cuda replaced, NVML faked ------------------------------------------


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """torch.cuda's calls with fixed figures (50 GiB reserved at the peak), on torch's device ``B``."""
    applied: dict[str, object] = {}
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index: 0)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda index: {"num_alloc_retries": 0, "num_ooms": 0})
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda index: 40 * GiB)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda index: 50 * GiB)
    monkeypatch.setattr(runtime, "apply_budget_bytes", lambda b, index: applied.update(budget=b, index=index))
    monkeypatch.setattr(runtime, "reset_peaks", lambda index: None)
    monkeypatch.setattr(runtime, "device_ids", lambda index: (B[4:], None))  # torch prints UUIDs bare
    return applied


def fake_pynvml(monkeypatch: pytest.MonkeyPatch, ours: int) -> None:
    """Two GPUs; this process holds ``ours`` on B (torch's device) and little on A."""
    a = FakeDevice(A, "00000000:17:00.0", procs=[proc(os.getpid(), GiB)])
    b = FakeDevice(B, "00000000:65:00.0", procs=[proc(os.getpid(), ours), proc(1, 5 * GiB)])
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([a, b]))


def run_cuda_branch(request: ProbeRequest) -> ProbeOutcome:
    outcome = fits()
    device = backend_for(request.device)
    device.apply(request, outcome)
    assert device.peak() == 50 * GiB
    device.finish(outcome)
    return outcome


def test_worker_judges_nvml_figure_of_the_probe_device_against_the_request_limit(fake_cuda, monkeypatch):
    fake_pynvml(monkeypatch, ours=LIMIT + GiB)
    outcome = run_cuda_branch(cuda_request(device="cuda:1"))
    assert fake_cuda == {"budget": 60 * GiB, "index": 1}
    assert outcome.device_stats["nvml_process_bytes"] == LIMIT + GiB  # device B's figure, not A's
    assert outcome.kind == "oom" and "NVML" in (outcome.reason or "")


def test_worker_under_the_limit_fits(fake_cuda, monkeypatch):
    fake_pynvml(monkeypatch, ours=LIMIT - GiB)
    outcome = run_cuda_branch(cuda_request())
    assert outcome.kind == "fits" and outcome.device_stats["max_memory_reserved"] == 50 * GiB


def test_worker_without_nvml_has_no_process_figure_and_judges_the_rest(fake_cuda, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    outcome = run_cuda_branch(cuda_request())
    assert outcome.kind == "fits" and outcome.device_stats["nvml_process_bytes"] is None
    over = run_cuda_branch(cuda_request(budget_bytes=40 * GiB))
    assert over.kind == "oom" and "over the budget" in (over.reason or "")


# --- the limit's way from the budget into every request -----------------------------------------------


def test_session_puts_the_cuda_process_limit_into_every_request(tmp_path):
    session = Session(session_settings("cuda:0", timeout=60), spec=ScriptSpec.file(tmp_path / "train.py"))
    snapshot = CudaSnapshot(0, "A100", 80 * GiB, free_bytes=70 * GiB, context_bytes=500 * MiB)
    budget = cuda_budget(snapshot, memory=None, headroom=0.1)
    session.device = device_info("cuda:0", {"snapshot": snapshot.to_dict()}, memory=None, headroom=0.1)
    assert session.device.process_limit_bytes == budget.process_limit_bytes
    assert session.device.to_dict()["process_limit_bytes"] == budget.process_limit_bytes
    combo = Combo("32-true", "adamw")
    for request in (
        session.request(combo, 8, steps=(3, 8)),
        session.request(combo, 8, steps=(3, 8), op="explain", budget_bytes=GiB),
    ):
        crossed = ProbeRequest.from_dict(json.loads(json.dumps(request.to_dict())))
        assert crossed.process_limit_bytes == budget.process_limit_bytes


def test_cpu_requests_carry_no_process_limit(tmp_path):
    settings = session_settings("cpu", memory=2 * GiB, timeout=60)
    session = Session(settings, spec=ScriptSpec.file(tmp_path / "train.py"))
    session.device = device_info(
        "cpu", {"available_bytes": 8 * GiB, "baseline_bytes": 300 * MiB}, memory=2 * GiB, headroom=0.1
    )
    assert session.device.process_limit_bytes is None
    assert session.request(Combo("32-true", "sgd"), 8, steps=(3, 8)).process_limit_bytes is None
