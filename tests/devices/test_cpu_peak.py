"""The CPU's peak from readings of /proc/self/status (autobatch.devices.cpu: peak_data_bytes, DataPeak, Ballast)."""

from __future__ import annotations

import mmap

from autobatch.devices.cpu import Ballast, DataPeak, VmStatus, peak_data_bytes, read_status

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


def test_a_mark_read_again_keeps_the_mappings_it_was_set_under() -> None:
    # a DataLoader's batches arrive as shared memory, not data: the step peaked at 500 MiB of data with two
    # batches of 8 MiB mapped (one that came out of order); the next step peaked lower with one mapped. Read
    # against the second step's mappings, the first step's mark counted a batch as data (508 MiB, a peak above
    # what the cap let the process hold)
    start = VmStatus(data=300 * MIB, size=700 * MIB, peak=700 * MIB)
    meter = DataPeak(start)
    assert meter.read(VmStatus(data=320 * MIB, size=736 * MIB, peak=916 * MIB)) == 500 * MIB
    assert meter.read(VmStatus(data=320 * MIB, size=728 * MIB, peak=916 * MIB)) == 500 * MIB
    assert peak_data_bytes(start, VmStatus(data=320 * MIB, size=728 * MIB, peak=916 * MIB)) == 508 * MIB


def test_a_library_mapped_after_the_mark_does_not_hide_it() -> None:
    # 800 MiB of data at the mark; a 50 MiB library loaded later lifts the mark by 10 MiB at 760 MiB of data
    start = VmStatus(data=300 * MIB, size=700 * MIB, peak=700 * MIB)
    meter = DataPeak(start)
    assert meter.read(VmStatus(data=310 * MIB, size=710 * MIB, peak=1200 * MIB)) == 800 * MIB
    assert meter.read(VmStatus(data=310 * MIB, size=760 * MIB, peak=1210 * MIB)) == 800 * MIB
    assert meter.read(VmStatus(data=310 * MIB, size=760 * MIB, peak=1300 * MIB)) == 850 * MIB


def test_the_data_held_at_a_reading_counts_when_the_mark_did_not_move() -> None:
    # a 512 MiB file mapped and closed before the start, then data freed elsewhere and taken again below the mark
    start = VmStatus(data=250 * MIB, size=660 * MIB, peak=1172 * MIB)
    meter = DataPeak(start)
    assert meter.read(VmStatus(data=240 * MIB, size=650 * MIB, peak=1172 * MIB)) == 250 * MIB
    assert meter.read(VmStatus(data=270 * MIB, size=630 * MIB, peak=1172 * MIB)) == 270 * MIB


def test_without_a_start_the_whole_life_of_the_process_counts() -> None:
    assert DataPeak().read(VmStatus(data=300 * MIB, size=700 * MIB, peak=900 * MIB)) == 500 * MIB


def test_a_ballast_holds_address_space_and_no_data() -> None:
    ballast = Ballast()
    before = read_status()
    ballast.hold(64 * MIB)
    held = read_status()
    assert held.size - before.size == 64 * MIB and abs(held.data - before.data) < MIB
    ballast.hold(16 * MIB + 1)  # rounded up to a page
    assert ballast.size == 16 * MIB + mmap.PAGESIZE
    ballast.hold(-5)
    assert ballast.size == 0 and read_status().size <= before.size + MIB


def test_a_ballast_keeps_the_mappings_at_the_mark_s_level() -> None:
    # the mark rose under 416 MiB of mappings that are not data; a reading with 408 MiB of them (a batch of 8 MiB
    # no longer mapped) and 2 MiB of ballast already held: 6 MiB more keep them at 416 MiB
    meter = DataPeak(VmStatus(data=300 * MIB, size=700 * MIB, peak=700 * MIB))
    meter.read(VmStatus(data=320 * MIB, size=736 * MIB, peak=916 * MIB))
    ballast = Ballast()
    ballast.hold(2 * MIB)
    ballast.follow(meter, VmStatus(data=320 * MIB, size=728 * MIB, peak=916 * MIB))
    assert ballast.size == 10 * MIB
    ballast.follow(meter, VmStatus(data=320 * MIB, size=756 * MIB, peak=916 * MIB))  # more mapped than then
    assert ballast.size == 0
