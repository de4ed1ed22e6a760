"""autobatch.devices.cuda.budget: budget arithmetic and the verdict on a step, fed with injected figures.

There is no GPU on the development machines; this module needs none: it is arithmetic over snapshots
and step stats.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autobatch.devices.cuda.budget import (
    DEFAULT_CONTEXT_BYTES,
    CudaSnapshot,
    CudaStepStats,
    cuda_budget,
    estimate_context,
    fraction_for,
    judge_step,
    precision_support,
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


def test_the_drivers_reservation_nvml_counts_as_used_is_not_other_processes():
    # An idle A10 under driver 535: NVML's device-level `used` (nvmlDeviceGetMemoryInfo, v1: "Sum of Reserved and
    # Allocated device memory") was 517 MiB with no process listed, memory the driver and firmware reserve outside
    # the total CUDA reports (cudaMemGetInfo). Only this process's context is in use by CUDA's count.
    from autobatch.devices.budget import device_info

    context = 300 * MiB
    s = snap(
        name="NVIDIA A10",
        total_bytes=22 * GiB,
        free_bytes=22 * GiB - context,
        nvml_used_by_others_bytes=0,
        nvml_device_used_bytes=517 * MiB + context,
        nvml_process_bytes=context,
        context_bytes=context,
        context_source="nvml",
    )
    b = cuda_budget(s, memory=None, headroom=0.0)
    assert (b.others_bytes, b.held_by_others_bytes) == (0, 0)
    assert b.budget_bytes == 22 * GiB - context and b.process_limit_bytes == 22 * GiB
    assert cuda_budget(s, memory=22 * GiB, headroom=0.1).capacity_bytes == 22 * GiB  # the whole card is free
    info = device_info("cuda:0", {"snapshot": s.to_dict()}, memory=None, headroom=0.1)
    assert info.others_bytes == 0 and not any("other processes hold" in w for w in info.warnings)


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


def test_snapshot_crosses_processes_as_json():
    s = snap(nvml_used_by_others_bytes=1, uuid="GPU-1234", pci_bus_id="00000000:65:00.0", notes=("x",))
    assert CudaSnapshot.from_dict(json.loads(json.dumps(s.to_dict()))) == s


def test_fraction_for():
    assert fraction_for(40 * GiB, 80 * GiB) == 0.5 and isinstance(fraction_for(1, 3), float)
    assert fraction_for(100 * GiB, 80 * GiB) == 1.0
    with pytest.raises(DeviceError):
        fraction_for(0, 80 * GiB)


# --- judging a step --------------------------------------------------------------------------------


def test_step_that_needed_allocator_retries_does_not_fit():
    stats = CudaStepStats(max_allocated=10 * GiB, max_reserved=11 * GiB, num_alloc_retries=2)
    fits, reason = judge_step(stats, 60 * GiB, 70 * GiB)
    assert not fits
    assert reason == "allocator had to flush its cache (num_alloc_retries=2): too tight"


def test_caught_ooms_and_reserved_over_budget_do_not_fit():
    fits, reason = judge_step(CudaStepStats(GiB, GiB, num_ooms=1), 60 * GiB, 70 * GiB)
    assert not fits and "num_ooms=1" in (reason or "")
    fits, reason = judge_step(CudaStepStats(GiB, 61 * GiB), 60 * GiB, None)
    assert not fits and "over the budget" in (reason or "")


def test_process_over_what_the_device_leaves_does_not_fit():
    # Reserved memory is well within the budget, but the whole process (context, NCCL, cuBLAS
    # handles outside the allocator) holds more than the device leaves it.
    over = CudaStepStats(GiB, 50 * GiB, nvml_process_bytes=71 * GiB)
    fits, reason = judge_step(over, 60 * GiB, 70 * GiB)
    assert not fits
    assert reason == (
        "the process used 71.00 GiB on the device (NVML: CUDA context and memory outside PyTorch "
        "included), over the 70.00 GiB the device leaves it"
    )
    at_limit = CudaStepStats(GiB, 50 * GiB, nvml_process_bytes=70 * GiB)
    assert judge_step(at_limit, 60 * GiB, 70 * GiB) == (True, None)


def test_nvml_rule_needs_both_figures():
    over = CudaStepStats(GiB, 50 * GiB, nvml_process_bytes=71 * GiB)
    assert judge_step(over, 60 * GiB, None) == (True, None)  # no limit in the request (a CPU budget)
    unseen = CudaStepStats(GiB, 50 * GiB)  # NVML unavailable, or cannot see this PID
    assert judge_step(unseen, 60 * GiB, 70 * GiB) == (True, None)


def test_clean_step_within_budget_fits():
    stats = CudaStepStats(9 * GiB, 10 * GiB, 0, 0, nvml_process_bytes=11 * GiB)
    assert judge_step(stats, 60 * GiB, 70 * GiB) == (True, None)
    assert judge_step(CudaStepStats(GiB, 60 * GiB), 60 * GiB, 70 * GiB) == (True, None)  # exactly at the cap


def test_step_stats_carry_torch_names():
    stats = CudaStepStats(1, 2, 3, 4, nvml_process_bytes=5)
    assert stats.to_dict() == {
        "max_memory_allocated": 1,
        "max_memory_reserved": 2,
        "num_alloc_retries": 3,
        "num_ooms": 4,
        "nvml_process_bytes": 5,
    }
    assert json.loads(json.dumps(CudaStepStats(1, 2).to_dict()))["nvml_process_bytes"] is None


def test_precision_support():
    t4 = precision_support("Tesla T4", 7, 5, bf16_native=False)
    assert t4["32-true"] is None and t4["16-mixed"] is None
    assert "7.5" in (t4["bf16-mixed"] or "") and t4["bf16-true"] == t4["bf16-mixed"]
    assert all(v is None for v in precision_support("A100", 8, 0, bf16_native=True).values())
