"""When a maximum is not a memory maximum (a crash or timeout bounds it) and when peaks look flat."""

from __future__ import annotations

from autobatch.core.sanity import flat_peaks, limited_by

MiB = 1 << 20


def test_a_crash_right_above_the_maximum_limits_it() -> None:
    points = [(8, "fits", 100), (64, "crash", None), (32, "fits", 200), (33, "crash", None)]
    limit = limited_by(points, 32)
    assert limit is not None and (limit.status, limit.batch_size) == ("crash-limited", 33)
    assert "not by memory" in limit.reason(32)


def test_an_oom_right_above_the_maximum_is_a_memory_maximum() -> None:
    assert limited_by([(8, "fits", 1), (40, "timeout", None), (33, "oom", None)], 32) is None
    assert limited_by([(8, "fits", 1)], 8) is None


def test_a_crash_at_the_smallest_batch_limits_an_infeasible_combination() -> None:
    limit = limited_by([(1, "timeout", None), (8, "timeout", None)], None)
    assert limit is not None and (limit.kind, limit.batch_size) == ("timeout", 1)


def test_flat_peaks_over_a_wide_range_warn() -> None:
    budget = 900 * MiB
    flat = [(8, "fits", 500 * MiB), (4096, "fits", 500 * MiB + 100_000), (5000, "oom", None)]
    assert "does make_batch use its batch_size" in (flat_peaks(flat, budget) or "")
    growing = [(8, "fits", 500 * MiB), (64, "fits", 600 * MiB)]
    assert flat_peaks(growing, budget) is None
    narrow = [(1085, "fits", 989 * MiB), (2014, "fits", 986 * MiB)]  # the optimizer step's plateau
    assert flat_peaks(narrow, budget) is None
