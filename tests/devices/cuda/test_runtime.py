"""autobatch.devices.cuda.runtime: the torch.cuda calls, which only a real GPU can run.

The development machines have none: the test that applies and judges a real budget is marked ``gpu``
and skips without one. What runs everywhere: importing the CUDA path costs neither torch nor pynvml, and the
snapshot's logic with torch.cuda's answers injected (an idle card's figures) and a stand-in pynvml
(tests/fake_nvml.py): what it says of what NVML could not tell, through the command to the result. No GPU is
involved, and none is claimed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fake_nvml import A, FakeDevice, FakeNvml, proc
from support import run_main

from autobatch.cli.state import STATE
from autobatch.devices.cuda import runtime
from autobatch.devices.cuda.budget import cuda_budget, judge_step
from autobatch.devices.cuda.nvml import open_nvml
from autobatch.records.protocol import ProbeOutcome, ProbeRequest
from autobatch.settings import FIELDS
from autobatch.testing import FakeRunner, affine

MiB, GiB = 1 << 20, 1 << 30


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")
def test_real_budget_is_enforced_and_judged_on_a_gpu():
    import torch

    from autobatch.probe.oom import classify_exception

    def stats():
        with open_nvml(*runtime.device_ids(0)) as nvml:
            return runtime.read_step_stats(0, nvml)

    s = runtime.snapshot(0)
    b = cuda_budget(s, memory=min(2 * GiB, s.total_bytes - s.outside_bytes), headroom=0.1)
    runtime.apply_budget_bytes(b.budget_bytes, 0)
    try:
        runtime.reset_peaks(0)
        x = torch.empty(b.budget_bytes // 4, dtype=torch.uint8, device="cuda:0")
        runtime.synchronize(0)
        fitted = stats()
        assert fitted.max_reserved <= b.budget_bytes
        assert judge_step(fitted, b.budget_bytes, b.process_limit_bytes) == (True, None)
        with pytest.raises(torch.OutOfMemoryError) as info:
            torch.empty(b.budget_bytes, dtype=torch.uint8, device="cuda:0")
        assert classify_exception(info.value) == "oom"
        del x
        failed = stats()
        assert failed.num_ooms >= 1 and not judge_step(failed, b.budget_bytes, b.process_limit_bytes)[0]
    finally:
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0, 0)


def test_importing_the_cuda_path_and_the_classifier_imports_neither_torch_nor_pynvml():
    modules = "autobatch.probe.oom, autobatch.devices.cuda.budget, autobatch.devices.cuda.nvml, autobatch.devices.cuda.runtime"
    code = f"import sys, {modules}; print('torch' in sys.modules, 'pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


#: What the snapshot says when NVML lists the card but not this process (a container's PID namespace).
UNSEEN = "NVML cannot see this PID (a container?): the CUDA context is estimated"


@pytest.fixture
def idle_a100(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.cuda's answers as an idle 80 GiB A100 at PCI bus 17 gives them to a probe (600 MiB in use, no
    allocation of this process's yet), and NVML's: that card, one process of another PID namespace on it."""
    import torch

    props = SimpleNamespace(
        name="NVIDIA A100-SXM4-80GB", uuid=A.removeprefix("GPU-"), pci_bus_id=0x17, pci_domain_id=0,
        pci_device_id=0, total_memory=80 * GiB, major=8, minor=0,
    )  # fmt: skip
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (80 * GiB - 600 * MiB, 80 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: props.name)
    monkeypatch.setattr(runtime, "allocator_settings", dict)  # a torch that reports none
    card = FakeDevice(A, "00000000:17:00.0", procs=[proc(4_000_000, 600 * MiB)], used=600 * MiB)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([card]))


def tune_with(snapshot: dict[str, Any], folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``autobatch tune --device cuda:0 --json`` whose probes answer as a CUDA device with ``snapshot``."""

    class Runner(FakeRunner):
        def run(self, request: ProbeRequest) -> ProbeOutcome:
            if request.op == "inspect":
                self.requests.append(request)
                info = {**self._inspection(), "cuda_available": True, "snapshot": snapshot}
                return ProbeOutcome(kind="fits", info=info)
            return super().run(request)

    runner = Runner(affine(2 * GiB, 100 * MiB))
    monkeypatch.setattr(STATE, "runner_factory", lambda: runner)
    monkeypatch.chdir(folder)
    for info in FIELDS:
        if info.env not in ("AUTOBATCH_CACHE_DIR", "AUTOBATCH_LOCK_DIR"):
            monkeypatch.delenv(info.env, raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (folder / "train.py").write_text("# the fake runner never imports it\n")
    code, out, err = run_main(
        "tune", "train.py", "--device", "cuda:0", "-p", "32-true", "-o", "adamw", "--no-recompute", "--json"
    )
    assert code == 0, err
    return json.loads(out)


@pytest.mark.usefixtures("idle_a100")
def test_what_nvml_could_not_tell_reaches_the_results_notes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML lists the card but not this process: the context is estimated, and the snapshot says why. The note
    reaches the result beside the budget's lines (it stopped at the snapshot)."""
    snapshot = runtime.snapshot(0)
    assert snapshot.notes == (UNSEEN,) and snapshot.context_source == "estimate"
    result = tune_with(snapshot.to_dict(), tmp_path, monkeypatch)
    assert UNSEEN in result["notes"], result["notes"]
    assert any(note.startswith("- CUDA context 512.00 MiB (estimate") for note in result["notes"])


@pytest.mark.usefixtures("idle_a100")
def test_a_missing_pynvml_is_said_in_the_results_notes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed: import pynvml fails
    snapshot = runtime.snapshot(0)
    (note,) = snapshot.notes
    assert note.startswith("the CUDA context is estimated: pynvml is not importable")
    assert note.endswith("pip install nvidia-ml-py")
    assert note in tune_with(snapshot.to_dict(), tmp_path, monkeypatch)["notes"]
