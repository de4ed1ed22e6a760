"""The memory cgroup this process runs in: a container's ``-m``, a SLURM job's ``--mem``, a systemd unit's
``MemoryMax``. Its limit, not the host's free memory, is what a probe on the CPU device can grow into: past it
the kernel's out-of-memory killer ends the probe (a SIGKILL that reads as a crash), and under SLURM it marks the
job step as killed for memory.

Every level from this process's cgroup up to the root counts; the tightest one decides (a job's cgroup limited,
its step's not). cgroup v2 (``memory.max``, ``memory.current``) and v1's memory controller
(``memory.limit_in_bytes``, ``memory.usage_in_bytes``). In use means the working set: the usage less the
inactive page cache (``memory.stat``'s ``inactive_file``, v1 ``total_inactive_file``), which the kernel reclaims
before it kills anything (as container runtimes count it).
"""

from __future__ import annotations

import os
from typing import NamedTuple

#: A limit at or above this is none (v1 writes "no limit" as a page-rounded 2**63 - 1).
UNLIMITED = 1 << 60


class CgroupMemory(NamedTuple):
    """One cgroup level's memory: its limit and its working set (bytes). A named tuple: the daemon's client reads
    its own cgroup on every command, and importing dataclasses would cost it more than the reading."""

    limit_bytes: int
    used_bytes: int

    @property
    def room_bytes(self) -> int:
        """What the processes of this cgroup may still take before the kernel kills one of them."""
        return max(0, self.limit_bytes - self.used_bytes)


#: The memory cgroup of the job a command runs for, when that is not this process's: a command the daemon runs
#: (:func:`for_job`). None: the job's cgroup is this process's, or the client's is not limited.
_job: CgroupMemory | None = None
#: Whether this process runs a command for a client (the daemon's): the job's cgroup is then the client's.
_for_client = False


def for_job(memory: CgroupMemory | None) -> None:
    """The job's memory cgroup as its client read it (None: not limited), in a command the daemon runs: its probes
    run in the daemon's cgroup, the job in its client's."""
    global _job, _for_client
    _job, _for_client = memory, True


def job_cgroup() -> CgroupMemory | None:
    """The client's cgroup, for a command the daemon runs (None: not limited, or not a daemon's command): a bound
    on the capacity beside the one this process's cgroup sets on its probes' reading."""
    return _job


def jobs_own() -> CgroupMemory | None:
    """The memory cgroup the job runs in: the client's for a command the daemon runs (None: not limited), else
    this process's. The daemon's own cgroup bounds only where the command's probes run (the capacity takes the
    tighter: :func:`autobatch.devices.budget.device_info`), not the job."""
    return _job if _for_client else cgroup_memory()


def cgroup_memory(root: str = "/sys/fs/cgroup", own: str = "/proc/self/cgroup") -> CgroupMemory | None:
    """The tightest memory cgroup level above this process (least room), or None when no level is limited or
    the cgroups cannot be read. ``root``: where the hierarchies are mounted; ``own``: this process's list."""
    levels = [level for hierarchy in _hierarchies(root, own) for level in hierarchy]
    limited = [memory for memory in map(_read, levels) if memory is not None]
    return min(limited, key=lambda m: m.room_bytes, default=None)


def oom_kills(root: str = "/sys/fs/cgroup", own: str = "/proc/self/cgroup") -> int | None:
    """How many processes the kernel's out-of-memory killer has killed in this process's memory cgroup (v2
    ``memory.events``, v1 ``memory.oom_control``); None where it cannot be read."""
    for (folder, v2), *_ in _hierarchies(root, own):
        found = _stat(os.path.join(folder, "memory.events" if v2 else "memory.oom_control"), "oom_kill")
        if found is not None:
            return found
    return None


def _hierarchies(root: str, own: str) -> list[list[tuple[str, bool]]]:
    """Each hierarchy's folders that may hold this process's memory cgroup, its own first (:func:`_levels`)."""
    try:
        with open(own) as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    return [levels for line in lines if (levels := _levels(root, line))]


def _levels(root: str, line: str) -> list[tuple[str, bool]]:
    """The folders of one hierarchy's line in ``/proc/self/cgroup``, this process's first, and whether they are
    v2's (none for a hierarchy without the memory controller)."""
    _, controllers, path = line.split(":", 2)
    if controllers == "":
        base, v2 = root, True
    elif "memory" in controllers.split(","):
        base, v2 = os.path.join(root, "memory"), False
    else:
        return []
    parts = [p for p in path.split("/") if p]
    return [(os.path.join(base, *parts[:depth]), v2) for depth in range(len(parts), -1, -1)]


def _read(level: tuple[str, bool]) -> CgroupMemory | None:
    folder, v2 = level
    limit = _number(os.path.join(folder, "memory.max" if v2 else "memory.limit_in_bytes"))
    if limit is None or limit >= UNLIMITED:
        return None
    usage = _number(os.path.join(folder, "memory.current" if v2 else "memory.usage_in_bytes"))
    if usage is None:
        return CgroupMemory(limit, 0)
    inactive = _stat(os.path.join(folder, "memory.stat"), "inactive_file" if v2 else "total_inactive_file")
    return CgroupMemory(limit, max(0, usage - (inactive or 0)))


def _number(path: str) -> int | None:
    """A file's integer (None: absent, unreadable, or "max")."""
    try:
        with open(path) as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _stat(path: str, key: str) -> int | None:
    try:
        with open(path) as handle:
            for line in handle:
                name, _, value = line.partition(" ")
                if name == key and value.strip().isdigit():
                    return int(value)
    except OSError:
        return None
    return None
