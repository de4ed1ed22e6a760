"""autobatch.devices.cuda.nvml: torch's device in NVML and per-process memory, through a fake NVML.

There is no GPU (and no driver) on the development machines: the mapping and the process figures are
tested with a fake shaped like nvidia-ml-py's functions (tests/fake_nvml.py).
"""

from __future__ import annotations

import os
import sys

import pytest
from fake_nvml import A, B, FakeDevice, FakeNvml, GiB, M, MiB, machine, proc

from autobatch.devices.cuda.nvml import (
    NvmlView,
    format_pci_bus_id,
    normalize_uuid,
    nvml_available,
    open_nvml,
    others_memory,
    pick_nvml_handle,
    process_memory,
    running_processes,
)


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
    view = NvmlView(FakeNvml([dev]), dev)
    assert view.process_bytes() == 700 * MiB and view.others_bytes() == GiB
    assert view.device_used_bytes() == 2 * GiB
    assert NvmlView(reason="no driver").process_bytes() is None


def test_ids_formatting():
    assert format_pci_bus_id(0, 0x65, 0) == "00000000:65:00.0"
    assert normalize_uuid(b"GPU-ABC") == "abc" and normalize_uuid("MIG-Abc") == "abc"


# --- on this machine (no GPU, no driver) -------------------------------------------------------------


def test_nvml_available_without_a_driver_returns_a_reason():
    ok, reason = nvml_available()
    if ok:
        pytest.skip(f"this machine has NVML: {reason}")
    assert "NVML" in reason and reason


def test_nvml_available_without_pynvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    ok, reason = nvml_available()
    assert not ok and "nvidia-ml-py" in reason
    with open_nvml("GPU-x", None) as view:
        assert view.handle is None and view.process_bytes() is None and "nvidia-ml-py" in (view.reason or "")


def test_a_jobs_memory_is_what_its_processes_hold_on_its_busiest_device():
    from autobatch.devices.cuda.nvml import JobMeter, job_memory

    first = FakeDevice(A, None, procs=[proc(100, 2 * GiB), proc(101, GiB), proc(999, 5 * GiB)])
    second = FakeDevice(B, None, procs=[proc(102, 2 * GiB + 512 * MiB), proc(103, None)])
    nvml = FakeNvml([first, second])
    assert job_memory(nvml, {100, 101, 102, 103}) == 3 * GiB  # the other user's 5 GiB is not the job's
    assert job_memory(nvml, {102, 103}) == 2 * GiB + 512 * MiB  # a process NVML cannot measure adds nothing
    assert job_memory(nvml, {103, 555}) is None
    meter = JobMeter(nvml)
    assert meter.read({100}) == 2 * GiB
    meter.close()  # a meter given its NVML does not shut it down
    assert meter.read({101}) == GiB


def test_without_nvml_a_jobs_cuda_peak_is_unknown_and_the_job_runs():
    from autobatch.supervise.job import JobSpec, launch

    code = "import sys, time; data = bytearray(64 << 20); time.sleep(1); sys.exit(3)"
    cuda = launch(JobSpec([sys.executable, "-c", code], dict(os.environ), device="cuda"))
    cpu = launch(JobSpec([sys.executable, "-c", code], dict(os.environ)))
    assert (cuda.returncode, cpu.returncode) == (3, 3)
    if not nvml_available()[0]:
        assert cuda.peak_bytes is None
    assert cpu.peak_bytes is not None and cpu.peak_bytes > 64 << 20


def test_device_memory_reads_version_2_with_the_drivers_reservation_apart_else_version_1():
    from autobatch.devices.cuda.nvml import DeviceMemory, device_memory

    idle = FakeDevice(A, None, total=22 * GiB)  # an idle A10 under driver 535
    idle.reserved = 517 * MiB
    old = FakeDevice(B, None, total=22 * GiB, used=517 * MiB)  # a driver with version 1 alone
    nvml = FakeNvml([idle, old])
    assert device_memory(nvml, idle) == DeviceMemory(22 * GiB, 0, 22 * GiB - 517 * MiB, 517 * MiB)
    assert device_memory(nvml, old) == DeviceMemory(22 * GiB, 517 * MiB, 22 * GiB - 517 * MiB, None)
    assert NvmlView(nvml, idle).device_used_bytes() == 0  # the snapshot's record, on CUDA's footing
