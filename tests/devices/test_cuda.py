"""autobatch.devices.cuda: budget arithmetic, step judgement and NVML mapping, fed with injected figures.

There is no GPU on the development machines: the logic is tested with snapshots, step stats and a
small fake NVML (plain classes shaped like nvidia-ml-py's functions); the test that applies a real
budget on a GPU is marked ``gpu`` and skips without one.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autobatch.devices import cuda
from autobatch.devices.cuda import (
    DEFAULT_CONTEXT_BYTES,
    Budget,
    CudaSnapshot,
    CudaStepStats,
    cuda_budget,
    estimate_context,
    format_pci_bus_id,
    fraction_for,
    judge_step,
    normalize_uuid,
    others_memory,
    pick_nvml_handle,
    precision_support,
    process_memory,
    running_processes,
)
from autobatch.errors import DeviceError, UsageError

MiB, GiB = 1 << 20, 1 << 30


def snap(**kw) -> CudaSnapshot:
    base = dict(device_index=0, name="NVIDIA A100-SXM4-80GB", total_bytes=80 * GiB, free_bytes=80 * GiB)
    return CudaSnapshot(**{**base, **kw})


# --- budget arithmetic --------------------------------------------------------------------------------


def test_budget_subtracts_other_processes_and_measured_context():
    context = 400 * MiB
    s = snap(
        free_bytes=80 * GiB - 10 * GiB - context,
        nvml_used_by_others_bytes=10 * GiB,
        nvml_process_bytes=context,
        context_bytes=context,
        context_source="nvml",
    )
    b = cuda_budget(s, memory=None, headroom=0.1)
    assert b.capacity_bytes == 80 * GiB and b.others_bytes == 10 * GiB and b.context_bytes == context
    assert b.budget_bytes == int((80 * GiB - 10 * GiB - context) * 0.9)
    assert b.fraction == pytest.approx(b.budget_bytes / (80 * GiB))
    assert b.process_limit_bytes == 70 * GiB and not b.calibrated
    assert any("measured with NVML" in line for line in b.breakdown)
    assert "set_per_process_memory_fraction" in b.breakdown[-1]


def test_device_level_usage_wins_over_a_smaller_nvml_sum():
    # NVML lists 2 GiB of other processes, but the device has 6 GiB in use beyond ours (a display
    # server, processes NVML hides, driver reservations): the larger figure is subtracted.
    context = 300 * MiB
    s = snap(
        free_bytes=80 * GiB - 6 * GiB - context,
        nvml_used_by_others_bytes=2 * GiB,
        context_bytes=context,
        context_source="nvml",
    )
    b = cuda_budget(s, memory=None, headroom=0.0)
    assert b.others_bytes == 6 * GiB
    assert b.budget_bytes == 80 * GiB - 6 * GiB - context


def test_container_without_visible_pid_estimates_the_context():
    # NVML cannot see our PID: others unknown (None), context estimated; the device-level figure
    # (total - free - reserved) still accounts for everything that is not PyTorch's.
    ctx, source = estimate_context(None, 0)
    assert (ctx, source) == (DEFAULT_CONTEXT_BYTES, "estimate") and ctx == 512 * MiB
    s = snap(free_bytes=80 * GiB - 3 * GiB, context_bytes=ctx, context_source=source)
    b = cuda_budget(s, memory=None, headroom=0.0)
    assert b.others_bytes + b.context_bytes == 3 * GiB
    assert b.budget_bytes == 77 * GiB
    assert any("estimate" in line for line in b.breakdown)


def test_context_measured_excludes_what_torch_reserved():
    assert estimate_context(900 * MiB, 400 * MiB) == (500 * MiB, "nvml")
    assert estimate_context(100 * MiB, 400 * MiB) == (0, "nvml")


def test_memory_reserved_by_torch_is_not_counted_as_other_processes():
    s = snap(free_bytes=80 * GiB - 2 * GiB - 500 * MiB, torch_reserved_bytes=2 * GiB, context_bytes=500 * MiB)
    assert s.outside_bytes == 500 * MiB
    assert cuda_budget(s, memory=None, headroom=0.0).others_bytes == 0


def test_memory_flag_calibrates_for_a_smaller_card():
    s = snap(
        free_bytes=80 * GiB - 10 * GiB - 500 * MiB,
        nvml_used_by_others_bytes=10 * GiB,
        context_bytes=500 * MiB,
    )
    b = cuda_budget(s, memory=16 * GiB, headroom=0.1)
    assert b.calibrated and b.capacity_bytes == 16 * GiB
    assert b.others_bytes == 0  # other processes here are not on the 16 GiB card
    assert b.budget_bytes == int((16 * GiB - 500 * MiB) * 0.9)
    assert b.fraction == pytest.approx(b.budget_bytes / (80 * GiB))  # a fraction of THIS device's total
    assert b.process_limit_bytes == 16 * GiB


def test_memory_flag_cannot_exceed_what_is_available():
    s = snap(
        free_bytes=80 * GiB - 70 * GiB - 500 * MiB,
        nvml_used_by_others_bytes=70 * GiB,
        context_bytes=500 * MiB,
    )
    with pytest.raises(DeviceError) as info:
        cuda_budget(s, memory=16 * GiB, headroom=0.1)
    assert "held by other processes" in info.value.message and "at most 10.00 GiB" in (info.value.hint or "")
    with pytest.raises(DeviceError) as info:
        cuda_budget(snap(), memory=96 * GiB, headroom=0.1)
    assert "80.00 GiB in total" in info.value.message


def test_too_small_budget_is_a_device_error_with_a_hint():
    with pytest.raises(DeviceError) as info:
        cuda_budget(snap(context_bytes=512 * MiB), memory=256 * MiB, headroom=0.1)
    assert "no memory is left" in info.value.message and info.value.hint
    full = snap(free_bytes=0, context_bytes=300 * MiB)  # other processes hold the whole card
    with pytest.raises(DeviceError):
        cuda_budget(full, memory=None, headroom=0.1)


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5])
def test_headroom_out_of_range_is_a_usage_error(bad):
    with pytest.raises(UsageError):
        cuda_budget(snap(), memory=None, headroom=bad)


@given(
    total=st.integers(1 * GiB, 200 * GiB),
    used_share=st.floats(0, 0.5),
    context=st.integers(0, 2 * GiB),
    headroom=st.floats(0, 0.5),
    more=st.floats(0.01, 0.4),
)
def test_budget_properties(total, used_share, context, headroom, more):
    outside = int(total * used_share)
    s = snap(total_bytes=total, free_bytes=total - outside - context, context_bytes=context)
    try:
        b = cuda_budget(s, memory=None, headroom=headroom)
    except DeviceError:
        assert int((total - outside - context) * (1 - headroom)) <= 0
        return
    assert 0 < b.budget_bytes <= b.capacity_bytes - b.others_bytes - b.context_bytes
    assert 0 < b.fraction <= 1 and b.fraction * total <= b.budget_bytes + 1
    try:
        tighter = cuda_budget(s, memory=None, headroom=min(0.99, headroom + more))
    except DeviceError:
        return
    assert tighter.budget_bytes <= b.budget_bytes


def test_snapshot_and_budget_cross_processes_as_json():
    s = snap(nvml_used_by_others_bytes=1, uuid="GPU-1234", pci_bus_id="00000000:65:00.0", notes=("x",))
    assert CudaSnapshot.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    b = cuda_budget(s, memory=None, headroom=0.1)
    assert json.loads(json.dumps(b.to_dict()))["budget_bytes"] == b.budget_bytes


def test_fraction_for():
    assert fraction_for(40 * GiB, 80 * GiB) == 0.5 and isinstance(fraction_for(1, 3), float)
    assert fraction_for(100 * GiB, 80 * GiB) == 1.0
    with pytest.raises(DeviceError):
        fraction_for(0, 80 * GiB)


# --- judging a step --------------------------------------------------------------------------------


def budget_of(b_bytes: int, limit: int = 70 * GiB) -> Budget:
    return Budget(
        80 * GiB, 80 * GiB, 80 * GiB - limit, 500 * MiB, 0.1, b_bytes, b_bytes / (80 * GiB), False, ()
    )


def test_step_that_needed_allocator_retries_does_not_fit():
    stats = CudaStepStats(max_allocated=10 * GiB, max_reserved=11 * GiB, num_alloc_retries=2)
    fits, reason = judge_step(stats, budget_of(60 * GiB))
    assert not fits
    assert reason == "allocator had to flush its cache (num_alloc_retries=2): too tight"


def test_caught_ooms_and_reserved_over_budget_do_not_fit():
    fits, reason = judge_step(CudaStepStats(GiB, GiB, num_ooms=1), budget_of(60 * GiB))
    assert not fits and "num_ooms=1" in (reason or "")
    fits, reason = judge_step(CudaStepStats(GiB, 61 * GiB), 60 * GiB)  # the worker passes bytes
    assert not fits and "over the budget" in (reason or "")


def test_process_over_what_the_device_leaves_does_not_fit():
    over = CudaStepStats(GiB, 50 * GiB, nvml_process_bytes=71 * GiB)
    fits, reason = judge_step(over, budget_of(60 * GiB, limit=70 * GiB))
    assert not fits and "NVML" in (reason or "")
    assert judge_step(over, 60 * GiB) == (True, None)  # bytes only: no process limit known


def test_clean_step_within_budget_fits():
    stats = CudaStepStats(9 * GiB, 10 * GiB, 0, 0, nvml_process_bytes=11 * GiB)
    assert judge_step(stats, budget_of(60 * GiB)) == (True, None)
    assert judge_step(CudaStepStats(GiB, 60 * GiB), 60 * GiB) == (True, None)  # exactly at the cap


# --- NVML mapping with a fake NVML --------------------------------------------------------------------


class FakeNvmlError(Exception):
    pass


class FakeMismatch(Exception):
    pass


class FakeDevice:
    def __init__(self, uuid, bus, procs=(), mig=None, used=0, locked=False):
        self.uuid, self.bus, self.procs, self.mig, self.used, self.locked = (
            uuid,
            bus,
            list(procs),
            mig,
            used,
            locked,
        )


class FakeNvml:
    """The subset of pynvml autobatch calls, over a list of devices (MIG children in ``mig``)."""

    NVMLError = FakeNvmlError
    NVMLLibraryMismatchError = FakeMismatch

    def __init__(self, devices, v3=True):
        self.devices, self.v3 = devices, v3

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        if self.devices[i].locked:
            raise FakeNvmlError("Insufficient Permissions")
        return self.devices[i]

    def nvmlDeviceGetUUID(self, h):
        return h.uuid

    def nvmlDeviceGetMigMode(self, h):
        if h.mig is None:
            raise FakeNvmlError("Not Supported")
        return [1, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, slot):
        if slot >= len(h.mig) or h.mig[slot] is None:
            raise FakeNvmlError("Not Found")
        return h.mig[slot]

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        for d in self.devices:
            if d.bus == bus.upper():
                return d
        raise FakeNvmlError("Not Found")

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        if not self.v3:
            raise FakeMismatch("Unversioned function called and the pyNVML version does not match")
        return [p for p in h.procs if getattr(p, "kind", "compute") == "compute"]

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h):
        return [p for p in h.procs if getattr(p, "kind", "compute") == "compute"]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return [p for p in h.procs if getattr(p, "kind", "compute") == "graphics"]

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=80 * GiB, free=80 * GiB - h.used, used=h.used)


def proc(pid, used, kind="compute"):
    return SimpleNamespace(pid=pid, usedGpuMemory=used, kind=kind)


A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
M = "MIG-cccccccc-1111-2222-3333-444444444444"


def machine(**kw):
    mig_parent = FakeDevice(
        "GPU-dddddddd-1111-2222-3333-444444444444", "00000000:CA:00.0", mig=[None, FakeDevice(M, None)]
    )
    devices = [FakeDevice(A, "00000000:17:00.0"), FakeDevice(B, "00000000:65:00.0"), mig_parent]
    return FakeNvml(devices, **kw)


def test_uuid_maps_torch_device_to_the_right_nvml_device_not_by_index():
    nvml = machine()
    # CUDA_VISIBLE_DEVICES=1: torch's device 0 is NVML's device 1; torch prints the UUID bare.
    assert pick_nvml_handle(nvml, "bbbbbbbb-1111-2222-3333-444444444444", None) is nvml.devices[1]
    assert pick_nvml_handle(nvml, B.upper(), None) is nvml.devices[1]
    assert pick_nvml_handle(nvml, A, "00000000:65:00.0") is nvml.devices[0]  # the UUID wins


def test_mig_instance_gets_its_own_handle():
    nvml = machine()
    handle = pick_nvml_handle(nvml, M, None)
    assert handle is nvml.devices[2].mig[1]
    assert pick_nvml_handle(nvml, "cccccccc-1111-2222-3333-444444444444", None) is handle


def test_pci_bus_id_fallback_and_its_limits():
    nvml = machine()
    assert pick_nvml_handle(nvml, None, "00000000:65:00.0") is nvml.devices[1]
    assert pick_nvml_handle(nvml, "GPU-unknown", "00000000:17:00.0") is nvml.devices[0]
    assert pick_nvml_handle(nvml, None, "00000000:CA:00.0") is None  # MIG parent: instance unknown
    assert pick_nvml_handle(nvml, "GPU-unknown", "00000000:99:00.0") is None
    assert pick_nvml_handle(nvml, None, None) is None  # never by index


def test_devices_without_permission_are_skipped():
    nvml = machine()
    nvml.devices[0].locked = True
    assert pick_nvml_handle(nvml, B, None) is nvml.devices[1]


def test_process_memory_for_visible_and_invisible_pids():
    dev = FakeDevice(A, None, procs=[proc(100, 900 * MiB), proc(200, 5 * GiB), proc(300, GiB, "graphics")])
    nvml = FakeNvml([dev])
    assert process_memory(nvml, dev, 100) == 900 * MiB
    assert others_memory(nvml, dev, 100) == 6 * GiB  # compute and graphics processes
    # Inside a container our PID is not the host PID NVML reports: unknown, and "others" cannot be
    # told apart from ourselves.
    assert process_memory(nvml, dev, 4242) is None
    assert others_memory(nvml, dev, 4242) is None


def test_process_memory_not_available_and_v2_fallback():
    dev = FakeDevice(A, None, procs=[proc(100, None), proc(200, GiB)])
    nvml = FakeNvml([dev], v3=False)  # a driver without the v3 call: nvidia-ml-py raises a mismatch
    assert running_processes(nvml, dev) == {100: None, 200: GiB}
    assert process_memory(nvml, dev, 100) is None
    assert others_memory(nvml, dev, 200) is None  # someone's usage is unknown


def test_dict_shaped_entries_and_duplicate_pids():
    dev = FakeDevice(A, None)
    nvml = FakeNvml([dev])
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda h: [{"pid": 7, "usedGpuMemory": 3 * MiB}]
    nvml.nvmlDeviceGetGraphicsRunningProcesses = lambda h: [{"pid": 7, "usedGpuMemory": 5 * MiB}]
    assert process_memory(nvml, dev, 7) == 5 * MiB


def test_nvml_view_reads_through_the_fake():
    dev = FakeDevice(A, None, procs=[proc(os.getpid(), 700 * MiB), proc(1, GiB)], used=2 * GiB)
    view = cuda.NvmlView(FakeNvml([dev]), dev)
    assert view.process_bytes() == 700 * MiB and view.others_bytes() == GiB
    assert view.device_used_bytes() == 2 * GiB
    assert cuda.NvmlView(reason="no driver").process_bytes() is None


def test_ids_formatting():
    assert format_pci_bus_id(0, 0x65, 0) == "00000000:65:00.0"
    assert normalize_uuid(b"GPU-ABC") == "abc" and normalize_uuid("MIG-Abc") == "abc"


# --- on this machine (no GPU, no driver) -------------------------------------------------------------


def test_nvml_available_without_a_driver_returns_a_reason():
    ok, reason = cuda.nvml_available()
    if ok:
        pytest.skip(f"this machine has NVML: {reason}")
    assert "NVML" in reason and reason


def test_nvml_available_without_pynvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    ok, reason = cuda.nvml_available()
    assert not ok and "nvidia-ml-py" in reason
    with cuda.open_nvml("GPU-x", None) as view:
        assert view.handle is None and view.process_bytes() is None and "nvidia-ml-py" in (view.reason or "")


def test_precision_support():
    t4 = precision_support("Tesla T4", 7, 5, bf16_native=False)
    assert t4["32-true"] is None and t4["16-mixed"] is None
    assert "7.5" in (t4["bf16-mixed"] or "") and t4["bf16-true"] == t4["bf16-mixed"]
    assert all(v is None for v in precision_support("A100", 8, 0, bf16_native=True).values())


# --- a real GPU ------------------------------------------------------------------------------------------


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

    from autobatch.oom import classify_exception

    s = cuda.snapshot(0)
    b = cuda_budget(s, memory=min(2 * GiB, s.total_bytes - s.outside_bytes), headroom=0.1)
    cuda.apply_budget(b, 0)
    try:
        cuda.reset_peaks(0)
        x = torch.empty(b.budget_bytes // 4, dtype=torch.uint8, device="cuda:0")
        cuda.synchronize(0)
        stats = cuda.read_step_stats(0)
        assert stats.max_reserved <= b.budget_bytes
        assert judge_step(stats, b) == (True, None)
        with pytest.raises(torch.OutOfMemoryError) as info:
            torch.empty(b.budget_bytes, dtype=torch.uint8, device="cuda:0")
        assert classify_exception(info.value) == "oom"
        del x
        stats = cuda.read_step_stats(0)
        assert stats.num_ooms >= 1 and not judge_step(stats, b)[0]
    finally:
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0, 0)


def test_importing_the_cuda_path_and_the_classifier_imports_neither_torch_nor_pynvml():
    import subprocess

    code = "import sys, autobatch.oom, autobatch.devices.cuda; print('torch' in sys.modules, 'pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
