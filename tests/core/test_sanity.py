"""When a maximum is not a memory maximum (a crash or timeout bounds it) and when peaks look flat."""

from __future__ import annotations

from autobatch.core.sanity import batch_ignored, flat_peaks, limited_by
from autobatch.core.step_peaks import Reading

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


def _fit(batch: int, peak: int, seconds: float | None, phase: int | None = None) -> Reading:
    return Reading(batch, "fits", peak, step_seconds=seconds, phase_bytes=phase)


def test_peaks_and_step_times_that_never_move_mean_the_batch_never_reached_the_step() -> None:
    readings = [_fit(8, 314 * MiB, 0.15), _fit(249, 314 * MiB, 0.09), _fit(65536, 314 * MiB, 0.07)]
    found = batch_ignored(readings, 4 * MiB)
    assert found is not None and "batch 8 to batch 65536" in found and "8,192x" in found


def test_a_parameter_heavy_model_whose_optimizer_sets_a_flat_peak_is_not_called_one() -> None:
    # the optimizer step sets the peak; the forward and backward phase and the step time still grow
    phase_grows = [_fit(1, 986 * MiB, 0.30, 700 * MiB), _fit(2014, 989 * MiB, 0.33, 960 * MiB)]
    assert batch_ignored(phase_grows, 4 * MiB) is None
    time_grows = [_fit(1, 986 * MiB, 0.05), _fit(2014, 989 * MiB, 2.4)]
    assert batch_ignored(time_grows, 4 * MiB) is None


def test_a_narrow_range_or_untimed_probes_cannot_tell() -> None:
    assert (
        batch_ignored([_fit(8, MiB, 0.3), _fit(256, MiB, 0.3)], 4 * MiB) is None
    )  # a small model: its fixed costs
    assert batch_ignored([_fit(8, MiB, None), _fit(65536, MiB, 0.1)], 4 * MiB) is None
    assert batch_ignored([_fit(8, MiB, 0.1), _fit(65536, 40 * MiB, 0.1)], 4 * MiB) is None
