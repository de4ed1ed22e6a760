"""The CPU's peak from two readings of /proc/self/status (autobatch.devices.cpu.peak_data_bytes)."""

from __future__ import annotations

from autobatch.devices.cpu import VmStatus, peak_data_bytes

MIB = 1 << 20


def test_a_fresh_process_counts_the_growth_of_its_high_water_mark() -> None:
    start = VmStatus(data=250 * MIB, size=660 * MIB, peak=660 * MIB)
    assert peak_data_bytes(start, VmStatus(data=255 * MIB, size=665 * MIB, peak=760 * MIB)) == 350 * MIB


def test_a_high_water_mark_from_before_the_start_is_not_the_periods() -> None:
    # a 512 MiB file mapped and closed before the start: VmPeak holds it, the period never came near it
    start = VmStatus(data=250 * MIB, size=660 * MIB, peak=1172 * MIB)
    assert peak_data_bytes(start, VmStatus(data=255 * MIB, size=665 * MIB, peak=1172 * MIB)) == 255 * MIB


def test_a_period_that_passes_the_old_mark_counts_from_the_start() -> None:
    start = VmStatus(data=250 * MIB, size=660 * MIB, peak=700 * MIB)
    assert peak_data_bytes(start, VmStatus(data=255 * MIB, size=665 * MIB, peak=760 * MIB)) == 350 * MIB


def test_a_cap_at_or_below_zero_allows_no_data_not_any() -> None:
    # setrlimit takes a negative value as an unsigned one: a budget less an offset larger than it was no cap
    import subprocess
    import sys

    code = (
        "import resource\nfrom autobatch.devices.cpu import apply_cap\napply_cap(-17 << 20)\n"
        "print(*resource.getrlimit(resource.RLIMIT_DATA))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0", "0"]
