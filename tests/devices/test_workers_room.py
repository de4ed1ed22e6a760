"""Room for the DataLoader workers in a memory cgroup: the job's process and the processes its script starts fit
there together, so the capacity is the cgroup's room less what the workers were measured to hold (figures
injected here; tests/cli/test_cgroup_e2e.py runs the command in a real cgroup)."""

from __future__ import annotations

import pytest

from autobatch.devices.budget import DeviceInfo, make_room_for_workers, workers_outgrew
from autobatch.errors import UsageError
from autobatch.records.protocol import ProbeOutcome

MiB = 1 << 20


def _cpu(capacity: int, room: int | None, baseline: int = 300 * MiB) -> DeviceInfo:
    budget = int(capacity * 0.9)
    return DeviceInfo(
        "cpu", "cpu", capacity, budget, 0.1, "", baseline_bytes=baseline, cgroup_room_bytes=room
    )


def test_the_cgroup_s_room_is_shared_with_the_workers() -> None:
    device = _cpu(800 * MiB, room=800 * MiB)  # the capacity was the cgroup's room
    assert make_room_for_workers(device, 16 * MiB, 2)
    assert device.capacity_bytes == 784 * MiB and device.budget_bytes == int(784 * MiB * 0.9)
    assert device.workers_bytes == 16 * MiB and device.to_dict()["workers_bytes"] == 16 * MiB
    (note,) = device.notes
    assert note.startswith("budget 720.00 MiB lowered to 705.60 MiB (capacity 784.00 MiB)"), note
    assert "2 process(es)" in note and "16.00 MiB of their own" in note and "memory cgroup" in note


@pytest.mark.parametrize(
    ("capacity", "room", "lowered_to"),
    [
        (600 * MiB, 800 * MiB, None),  # --memory leaves them room beside it
        (790 * MiB, 800 * MiB, 784 * MiB),  # --memory leaves them 10 MiB of their 16: 6 MiB less
        (800 * MiB, None, None),  # no cgroup bounds the job: each process has its own cap
    ],
)
def test_only_what_the_workers_lack_is_taken(capacity: int, room: int | None, lowered_to: int | None) -> None:
    device = _cpu(capacity, room)
    assert make_room_for_workers(device, 16 * MiB, 2) is (lowered_to is not None)
    assert device.capacity_bytes == (lowered_to or capacity)
    assert bool(device.notes) is (lowered_to is not None)


def test_no_room_left_for_the_job_s_process_is_refused() -> None:
    device = _cpu(340 * MiB, room=340 * MiB, baseline=300 * MiB)
    with pytest.raises(UsageError, match="below what a probe process holds"):
        make_room_for_workers(device, 30 * MiB, 2)


def test_workers_that_grew_past_their_room_are_warned_of() -> None:
    device = _cpu(800 * MiB, room=800 * MiB)
    make_room_for_workers(device, 16 * MiB, 2)
    small = ProbeOutcome(kind="fits", batch_size=100, info={"child_own_bytes": 18 * MiB})  # within the margin
    assert workers_outgrew(device, small) is None
    large = ProbeOutcome(kind="fits", batch_size=7200, info={"child_own_bytes": 41 * MiB})
    text = workers_outgrew(device, large)
    assert text is not None and "at batch 7200" in text and "25.00 MiB more" in text, text
    assert "--memory 759.00 MiB" in text, text
    assert workers_outgrew(_cpu(800 * MiB, room=800 * MiB), large) is None  # nothing was set aside for them
