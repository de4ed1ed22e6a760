"""The memory cgroup's limit and room, read from cgroup v1 and v2 trees written here (the real cgroups are
exercised end to end in tests/cli/test_cgroup_e2e.py)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from autobatch.devices import cgroup
from autobatch.devices.cgroup import CgroupMemory, cgroup_memory

GiB, MiB = 1 << 30, 1 << 20


def level(folder: Path, **files: object) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in files.items():
        (folder / name.replace("__", ".")).write_text(f"{value}\n")


def test_v2_the_tightest_level_decides_and_inactive_cache_is_not_in_use(tmp_path: Path) -> None:
    own = tmp_path / "self-cgroup"
    own.write_text("0::/slurm/uid_0/job_7/step_batch\n")
    job, step = tmp_path / "slurm" / "uid_0" / "job_7", tmp_path / "slurm" / "uid_0" / "job_7" / "step_batch"
    level(job, memory__max=16 * GiB, memory__current=3 * GiB, memory__stat=f"anon 1\ninactive_file {GiB}")
    level(step, memory__max="max", memory__current=2 * GiB)  # the step unlimited: its job's limit holds
    assert cgroup_memory(str(tmp_path), str(own)) == CgroupMemory(16 * GiB, 2 * GiB)
    level(step, memory__max=4 * GiB, memory__current=3 * GiB, memory__stat=f"inactive_file {512 * MiB}")
    found = cgroup_memory(str(tmp_path), str(own))
    assert found == CgroupMemory(4 * GiB, 3 * GiB - 512 * MiB) and found.room_bytes == 1536 * MiB
    level(job, memory__max="max")
    level(step, memory__max="max")
    assert cgroup_memory(str(tmp_path), str(own)) is None


def test_v1_memory_controller_and_its_unlimited_root(tmp_path: Path) -> None:
    own = tmp_path / "self-cgroup"
    own.write_text("9:name=systemd:/\n4:memory:/docker/abc\n1:cpu:/\n0::/\n")
    root, container = tmp_path / "memory", tmp_path / "memory" / "docker" / "abc"
    level(root, memory__limit_in_bytes=9223372036854771712, memory__usage_in_bytes=20 * GiB)
    level(container, memory__limit_in_bytes=2 * GiB, memory__usage_in_bytes=GiB,
          memory__stat=f"cache 5\ntotal_inactive_file {256 * MiB}")  # fmt: skip
    assert cgroup_memory(str(tmp_path), str(own)) == CgroupMemory(2 * GiB, 768 * MiB)


def test_no_cgroup_file_or_no_memory_controller_is_no_limit(tmp_path: Path) -> None:
    assert cgroup_memory(str(tmp_path), str(tmp_path / "absent")) is None
    own = tmp_path / "self-cgroup"
    own.write_text("3:cpuset:/\n")
    assert cgroup_memory(str(tmp_path), str(own)) is None


def test_the_kernels_kills_are_read_from_the_own_cgroup_in_either_version(tmp_path: Path) -> None:
    from autobatch.devices.cgroup import oom_kills

    own = tmp_path / "self-cgroup"
    own.write_text("4:memory:/job\n0::/\n")
    level(tmp_path / "memory" / "job", memory__oom_control="oom_kill_disable 0\nunder_oom 0\noom_kill 3")
    assert oom_kills(str(tmp_path), str(own)) == 3
    own.write_text("0::/user/job\n")
    level(tmp_path / "user" / "job", memory__events="low 0\nhigh 0\nmax 2\noom 1\noom_kill 1")
    assert oom_kills(str(tmp_path), str(own)) == 1
    own.write_text("3:cpuset:/\n")
    assert oom_kills(str(tmp_path), str(own)) is None


@pytest.fixture
def as_the_daemons_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """What :func:`autobatch.devices.cgroup.for_job` sets in this test, undone after it (it sets it for the life of a
    command the daemon forked, a process of its own)."""
    monkeypatch.setattr(cgroup, "_job", None)
    monkeypatch.setattr(cgroup, "_for_client", False, raising=False)


@pytest.mark.usefixtures("as_the_daemons_command")
def test_the_jobs_cgroup_bounds_the_cpu_capacity_where_the_probes_run_in_another() -> None:
    """A command the daemon runs: its inspection reads the daemon's memory, the job's cgroup came with the
    request (:func:`autobatch.devices.cgroup.for_job`); the tighter is the capacity, and the note says why."""
    from autobatch.devices.budget import device_info

    host = {"available_bytes": 20 * GiB, "total_bytes": 24 * GiB, "baseline_bytes": 300 * MiB}
    assert device_info("cpu", host, memory=None, headroom=0.1).capacity_bytes == 20 * GiB
    cgroup.for_job(CgroupMemory(2 * GiB, 512 * MiB))
    found = device_info("cpu", host, memory=None, headroom=0.1)
    assert found.capacity_bytes == 1536 * MiB
    assert any("the room left in the job's memory cgroup (1.50 GiB: limit 2.00 GiB" in n for n in found.notes)
    assert "20.00 GiB available" in " ".join(found.notes)


@pytest.mark.usefixtures("as_the_daemons_command")
def test_the_host_line_names_the_clients_cgroup_limit_for_a_command_the_daemon_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inventory's host memory names the limit of the job's cgroup: the client's for a command the daemon
    runs, as the client read it, never the daemon's, whose cgroup bounds only where the command's probes run. It
    named the daemon's where the client was not limited, or had more room than the daemon."""
    from autobatch.devices.inventory import host_memory

    own = tmp_path / "self-cgroup"  # this process's cgroup stands for the daemon's: 2 GiB, 1.5 GiB in use
    own.write_text("0::/autobatch-daemon\n")
    level(tmp_path / "autobatch-daemon", memory__max=2 * GiB, memory__current=1536 * MiB)
    monkeypatch.setattr(
        cgroup, "cgroup_memory", functools.partial(cgroup.cgroup_memory, str(tmp_path), str(own))
    )
    assert host_memory().cgroup_limit_bytes == 2 * GiB  # in-process: this process's cgroup is the job's
    cgroup.for_job(None)  # a client no cgroup limits
    assert host_memory().cgroup_limit_bytes is None
    cgroup.for_job(CgroupMemory(8 * GiB, 1 * GiB))  # a client with more room than the daemon
    assert host_memory().cgroup_limit_bytes == 8 * GiB
    cgroup.for_job(CgroupMemory(1 * GiB, 256 * MiB))  # and with less
    assert host_memory().cgroup_limit_bytes == 1 * GiB
