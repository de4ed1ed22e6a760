"""The CPU capacity under the process's own resource limits (a job script's ``ulimit -d`` / ``ulimit -v``):
what they leave for data memory, how it bounds the capacity, and a ``--memory`` above it refused."""

from __future__ import annotations

import resource
import subprocess
import sys
from collections.abc import Iterator

import pytest

from autobatch.devices.budget import capacity_note, check_cpu_memory
from autobatch.devices.cgroup import CgroupMemory
from autobatch.devices.cpu import ProcessLimit, VmStatus, process_limit, within
from autobatch.errors import UsageError

MiB, GiB = 1 << 20, 1 << 30
HOST = {"available_bytes": 20 * GiB, "total_bytes": 24 * GiB}


@pytest.fixture
def soft_limits() -> Iterator[None]:
    """The soft limits of this process, restored after (a soft limit may be raised again up to the hard one)."""
    saved = {which: resource.getrlimit(which) for which in (resource.RLIMIT_DATA, resource.RLIMIT_AS)}
    yield
    for which, limits in saved.items():
        resource.setrlimit(which, limits)


def test_the_data_limit_bounds_data_memory_and_the_address_space_limit_less_the_other_mappings(
    soft_limits: None,
) -> None:
    status = VmStatus(data=300 * MiB, size=300 * MiB + GiB, peak=300 * MiB + GiB)  # 1 GiB of libraries, files
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (8 * GiB, hard))
    assert process_limit(status) == ProcessLimit(7 * GiB, "RLIMIT_AS (ulimit -v)")
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (2 * GiB, hard))
    assert process_limit(status) == ProcessLimit(2 * GiB, "RLIMIT_DATA (ulimit -d)")  # the tighter of the two


def test_a_limit_bounds_the_capacity_only_where_it_is_the_tighter(soft_limits: None) -> None:
    assert within(HOST) == HOST
    assert within(HOST, limit=ProcessLimit(32 * GiB, "RLIMIT_DATA (ulimit -d)")) == HOST
    bounded = within(HOST, limit=ProcessLimit(2 * GiB, "RLIMIT_DATA (ulimit -d)"))
    assert bounded["available_bytes"] == bounded["total_bytes"] == bounded["process_limit_bytes"] == 2 * GiB
    assert bounded["available_by"] == bounded["total_by"] == "process"
    note = capacity_note(bounded)
    assert note is not None and "RLIMIT_DATA (ulimit -d) leaves for its data memory (2.00 GiB)" in note
    check_cpu_memory(2 * GiB, bounded)  # at the limit: allowed
    with pytest.raises(UsageError, match=r"RLIMIT_DATA \(ulimit -d\) lets it hold \(2.00 GiB\)") as raised:
        check_cpu_memory(3 * GiB, bounded)
    assert "ulimit -S -d unlimited" in (raised.value.hint or "")


def test_no_cap_is_set_above_the_hard_limit_the_process_inherited() -> None:
    # A job script's `ulimit -d` sets the hard limit too: raising it is refused ("not allowed to raise maximum
    # limit"), which failed the first probe, and would fail `autobatch run`'s launch of the job.
    code = (
        "import resource\n"
        "from autobatch.devices.cpu import apply_cap\n"
        f"resource.setrlimit(resource.RLIMIT_DATA, ({GiB}, {GiB}))\n"
        f"apply_cap({4 * GiB})\n"
        f"assert resource.getrlimit(resource.RLIMIT_DATA) == ({GiB}, {GiB})\n"
        f"apply_cap({GiB // 2})\n"
        f"assert resource.getrlimit(resource.RLIMIT_DATA) == ({GiB // 2}, {GiB // 2})\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


def test_the_note_names_the_job_cgroup_when_it_is_tighter_than_the_process_limit() -> None:
    limited = within(HOST, limit=ProcessLimit(4 * GiB, "RLIMIT_DATA (ulimit -d)"))
    bounded = within(
        limited, cgroup=CgroupMemory(3 * GiB, GiB)
    )  # a daemon's client in a cgroup with 2 GiB of room
    assert (bounded["total_by"], bounded["available_by"]) == ("cgroup", "cgroup")
    note = capacity_note(bounded)
    assert note is not None and "the room left in the job's memory cgroup (2.00 GiB" in note
    # the same bounds read in one process: the cgroup first, then the limit, which decides neither
    at_once = within(HOST, cgroup=CgroupMemory(3 * GiB, GiB), limit=ProcessLimit(4 * GiB, "x"))
    figures = ("total_bytes", "available_bytes", "total_by", "available_by")
    assert [at_once[key] for key in figures] == [bounded[key] for key in figures]


def test_each_figure_names_the_bound_that_decided_it() -> None:
    # A cgroup whose limit is under the machine's memory, with more room than the host has available: it bounds
    # the total, not what is available. A --memory above its limit named it; it named the machine's physical
    # memory (at the cgroup's figure) when only the available figure said which bound decided.
    host = {"available_bytes": 10 * GiB, "total_bytes": 24 * GiB}
    bounded = within(host, cgroup=CgroupMemory(16 * GiB, GiB))
    assert (bounded["total_bytes"], bounded.get("total_by")) == (16 * GiB, "cgroup")
    assert (bounded["available_bytes"], bounded.get("available_by")) == (10 * GiB, None)
    assert capacity_note(bounded) is None  # the capacity is the host's available memory
    with pytest.raises(UsageError, match=r"the job's memory cgroup allows \(16.00 GiB"):
        check_cpu_memory(20 * GiB, bounded)
    with pytest.raises(UsageError, match=r"this machine's physical memory \(24.00 GiB"):
        check_cpu_memory(30 * GiB, host)
