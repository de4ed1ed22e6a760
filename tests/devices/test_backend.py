"""The device backend: one protocol, a CPU and a CUDA implementation, chosen by the device's name.

The CPU backend runs for real in a child process (it caps that process's data memory with RLIMIT_DATA):
the fresh-process offset lowers the cap and raises every reading, a timing probe gets the job's allocator and
room for its heap, and the OpenMP wait policy is recorded. The CUDA backend runs with torch.cuda's calls
replaced (no GPU here): it records no CPU realism.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest
import torch
from requesting import probe_request

from autobatch.devices.backend import backend_for
from autobatch.devices.cpu import MALLOC_ENV, CpuBackend
from autobatch.devices.cuda import runtime
from autobatch.devices.cuda.backend import CudaBackend
from autobatch.records.protocol import ProbeOutcome

MiB, GiB = 1 << 20, 1 << 30

CHILD = """
import json, os, resource, sys
sys.path.insert(0, "tests")
from requesting import probe_request
from autobatch.devices.backend import backend_for
from autobatch.records.protocol import ProbeOutcome

values = json.loads(sys.argv[1])
request = probe_request(**values)
outcome = ProbeOutcome(kind="fits")
device = backend_for(request.device)
device.apply(request, outcome)
block = bytearray(64 << 20)  # 64 MiB more data memory
peak = device.peak()
device.synchronize()
device.finish(outcome)
print(json.dumps({
    "cap": resource.getrlimit(resource.RLIMIT_DATA)[0], "baseline": outcome.baseline_bytes, "peak": peak,
    "policy": outcome.omp_wait_policy, "kind": outcome.kind,
    "wait": device.load_meter()(),
}))
"""


def run_cpu_probe(env: dict[str, str] | None = None, **values: object) -> dict[str, object]:
    import os

    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps({"device": "cpu", **values})],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=True,
    )
    return json.loads(done.stdout)


def test_the_backend_follows_the_device_name():
    assert isinstance(backend_for("cpu"), CpuBackend)
    assert isinstance(backend_for("cuda"), CudaBackend) and backend_for("cuda").index == 0  # type: ignore[attr-defined]
    assert backend_for("cuda:3").index == 3  # type: ignore[attr-defined]
    cpu, cuda = backend_for("cpu"), backend_for("cuda:0")
    assert (cpu.fresh_process_differs, cpu.ranks_share_memory, dict(cpu.job_environment)) == (
        True,
        True,
        MALLOC_ENV,
    )
    assert (cuda.fresh_process_differs, cuda.ranks_share_memory, dict(cuda.job_environment)) == (
        False,
        False,
        {},
    )


def test_choosing_a_backend_imports_no_torch():
    code = "import sys; from autobatch.devices.backend import backend_for; backend_for('cuda:1'); backend_for('cpu'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_cpu_offset_lowers_the_cap_and_raises_every_reading():
    plain = run_cpu_probe(budget_bytes=4 * GiB)
    offset = run_cpu_probe(budget_bytes=4 * GiB, fresh_offset_bytes=[100 * MiB])
    assert plain["cap"] == 4 * GiB and offset["cap"] == 4 * GiB - 100 * MiB
    assert abs(int(offset["baseline"]) - int(plain["baseline"]) - 100 * MiB) < 32 * MiB
    assert int(plain["peak"]) >= int(plain["baseline"]) + 64 * MiB
    assert int(offset["peak"]) >= int(offset["baseline"]) + 64 * MiB
    assert plain["kind"] == "fits"


def test_cpu_timing_probe_runs_under_the_same_cap_as_the_search():
    """The job runs the probes' allocator (every CPU plan carries it), so a timing probe is capped as any."""
    assert run_cpu_probe(budget_bytes=4 * GiB, timing=True)["cap"] == 4 * GiB


def test_cpu_records_the_openmp_wait_policy_and_meters_the_wait():
    out = run_cpu_probe(env={"OMP_WAIT_POLICY": "PASSIVE"}, budget_bytes=4 * GiB)
    assert out["policy"] == "PASSIVE"
    assert out["wait"] is None or float(out["wait"]) >= 0  # type: ignore[arg-type]


def test_cpu_facts_read_the_baseline_and_try_each_precision():
    facts = backend_for("cpu").facts(("32-true",))
    assert facts["baseline_bytes"] > 0 and facts["total_bytes"] >= facts["available_bytes"] > 0
    assert "cuda_available" in facts
    assert facts["unsupported_precisions"] == {}  # a tiny step of each ran here


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    applied: dict[str, object] = {}
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: applied.update(device=index))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index: 300 * MiB)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda index: 2 * GiB)
    monkeypatch.setattr(runtime, "apply_budget_bytes", lambda b, index: applied.update(budget=b))
    monkeypatch.setattr(runtime, "reset_peaks", lambda index: applied.update(reset=index))
    monkeypatch.setattr(runtime, "snapshot_dict", lambda index: {"device_index": index})
    monkeypatch.setattr(
        runtime, "capabilities", lambda index: {"bf16-mixed": "no bf16 on this card", "32-true": None}
    )
    return applied


def test_cuda_caps_the_allocator_and_records_none_of_the_cpus_realism(fake_cuda, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    limit = resource.getrlimit(resource.RLIMIT_DATA)
    device = backend_for("cuda:2")
    outcome = ProbeOutcome(kind="fits")
    device.apply(
        probe_request(device="cuda:2", budget_bytes=GiB, fresh_offset_bytes=[100 * MiB], timing=True), outcome
    )
    assert fake_cuda == {"device": 2, "budget": GiB, "reset": 2}  # the offset does not touch a CUDA budget
    assert outcome.baseline_bytes == 300 * MiB and device.peak() == 2 * GiB
    assert outcome.omp_wait_policy is None
    assert device.load_meter()() is None
    assert resource.getrlimit(resource.RLIMIT_DATA) == limit


def test_cuda_facts_are_the_snapshot_and_the_cards_precisions(fake_cuda):
    facts = backend_for("cuda:1").facts(("32-true",))
    assert facts == {
        "snapshot": {"device_index": 1},
        "unsupported_precisions": {"bf16-mixed": "no bf16 on this card"},
    }
