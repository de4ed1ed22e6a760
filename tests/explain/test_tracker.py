"""The allocator models (CPU data memory, CUDA caching allocator) and the storage tracker."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autobatch.explain.worker.allocators import (
    CUDA_LARGE_BUFFER,
    CUDA_SMALL_BUFFER,
    CudaAllocatorModel,
    MiB,
    cpu_bytes,
    cuda_round,
    cuda_segment_size,
)
from autobatch.explain.worker.tracker import MemoryTracker


def test_cuda_rounding_and_segments() -> None:
    assert cuda_round(1) == 512 and cuda_round(512) == 512 and cuda_round(513) == 1024
    assert cuda_segment_size(512) == CUDA_SMALL_BUFFER  # <= 1 MiB: a 2 MiB small-pool segment
    assert cuda_segment_size(MiB) == CUDA_SMALL_BUFFER
    assert cuda_segment_size(MiB + 512) == CUDA_LARGE_BUFFER  # 1-10 MiB: a 20 MiB segment
    assert cuda_segment_size(10 * MiB) == 10 * MiB  # >= 10 MiB: its own, rounded to 2 MiB
    assert cuda_segment_size(11 * MiB) == 12 * MiB


def test_cuda_small_requests_share_a_segment_and_blocks_are_reused() -> None:
    model = CudaAllocatorModel()
    blocks = [model.alloc(1000) for _ in range(100)]  # 100 x 1024 B fit one 2 MiB segment
    assert model.current == CUDA_SMALL_BUFFER and model.allocated == 100 * 1024
    for block in blocks:
        model.free(block)
    assert model.allocated == 0 and model.current == CUDA_SMALL_BUFFER  # cached, not released
    model.alloc(CUDA_SMALL_BUFFER // 2)  # merged free blocks serve a larger small request
    assert model.current == CUDA_SMALL_BUFFER


def test_cuda_large_pool_splits_a_20_mib_segment() -> None:
    model = CudaAllocatorModel()
    first = model.alloc(3 * MiB)
    second = model.alloc(3 * MiB)
    assert model.current == CUDA_LARGE_BUFFER and model.segments == 1
    model.free(first)
    model.free(second)
    model.alloc(15 * MiB)  # the two freed blocks merged with the rest of the segment
    assert model.current == CUDA_LARGE_BUFFER
    model.alloc(12 * MiB)  # 12 MiB does not fit the 5 MiB left: its own segment
    assert model.current == CUDA_LARGE_BUFFER + 12 * MiB and model.peak == model.current


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 24 * MiB), st.booleans()), min_size=1, max_size=60))
def test_cuda_model_invariants(requests: list[tuple[int, bool]]) -> None:
    """Allocated never exceeds reserved; freeing everything leaves whole segments of free blocks."""
    model = CudaAllocatorModel()
    live = []
    for size, free_one in requests:
        live.append(model.alloc(size))
        assert model.allocated <= model.current <= model.peak
        if free_one and live:
            model.free(live.pop(0))
    for block in live:
        model.free(block)
    assert model.allocated == 0
    free_total = sum(block.size for pool in model._free.values() for block in pool)
    assert free_total == model.current
    assert len(model._free[True]) + len(model._free[False]) == model.segments  # every segment merged back


def test_cpu_bytes_follow_pinned_glibc() -> None:
    assert cpu_bytes(0) == 0
    assert cpu_bytes(100) == 112  # heap chunk: 8-byte header, 16-byte steps
    assert cpu_bytes(1 << 20) == (1 << 20) + 4096  # mapped: header and alignment slack cost a page
    assert cpu_bytes((1 << 20) - 200) == 1 << 20
    assert all(cpu_bytes(n) % 4096 == 0 for n in (65536, 100_000, 10**7))


def test_tracker_counts_views_once_and_releases() -> None:
    tracker = MemoryTracker()
    with tracker:
        base = torch.zeros(1024)  # 4 KiB
        view = base[:10]
        other = base.view(32, 32)
        assert tracker.tensor_bytes == 4096
        del base, other
        assert tracker.tensor_bytes == 4096  # the view keeps the storage alive
        del view
    assert tracker.tensor_bytes == 0
    assert tracker.peak.tensor_bytes == 4096


def test_tracker_moves_late_identified_storages_in_the_peak_snapshot() -> None:
    tracker = MemoryTracker()
    with tracker:
        state = torch.zeros(256)
        temp = torch.ones(256)
        del temp
        tracker.tag([state], "optimizer_state")
    assert tracker.peak.categories["optimizer_state"] == 1024
    assert tracker.peak.categories["temporaries"] == 1024
