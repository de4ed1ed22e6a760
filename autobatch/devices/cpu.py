"""The CPU device: an OS-enforced memory cap and a peak measured in the same quantity the cap limits.

``--memory`` is the capacity of the probe process's data memory (Linux's ``VmData``, imports included),
enforced with ``RLIMIT_DATA``; the peak is ``VmData`` at the probe's start plus the growth of ``VmPeak``
less the non-data mappings of the reading at which it rose (:class:`DataPeak`, with a :class:`Ballast`), so it
counts exactly what the cap counts; glibc's allocator is pinned in probe processes so that fit or no fit is
repeatable, and the job runs it too (:data:`MALLOC_ENV`). The definition is in docs/how-a-tune-works.md.
:class:`CpuBackend` holds what only this device has: the job's fresh-process offset and the OpenMP wait policy.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import resource
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from autobatch.devices.cgroup import CgroupMemory
    from autobatch.records.protocol import ProbeOutcome, ProbeRequest

#: Environment that pins glibc's malloc in CPU probe processes (set before the process starts), and in the job:
#: every CPU plan carries it (:attr:`autobatch.records.result.Chosen.environment`). Every block of 64 KiB or more
#: is a mapping of its own, returned to the system when freed, so a step's peak repeats from step to step and
#: from process to process. Under glibc's defaults the mmap threshold rises with every mapped block freed (up
#: to 32 MiB) and the heap keeps what a step freed: ``examples/as_is/plain_loop.py`` at 64 samples peaked
#: 626-665 MiB over two epochs against 442 MiB pinned, the heap growing over the epochs, which no probe of a few
#: steps sees (docs/how-a-tune-works.md, "The allocator the answer holds under").
MALLOC_ENV: dict[str, str] = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}

MEMORY_DEFINITION = (
    "cpu: VmData of the whole probe process (heap, anonymous mappings, thread stacks; imports included), "
    "capped with RLIMIT_DATA at memory x (1 - headroom)"
)


@dataclass(frozen=True)
class VmStatus:
    """The address-space figures of ``/proc/self/status`` that the cap and the peak depend on (bytes)."""

    data: int
    size: int
    peak: int

    @property
    def not_data(self) -> int:
        return self.size - self.data


def read_status(pid: int | str = "self") -> VmStatus:
    """Read VmData, VmSize and VmPeak of this process (or of ``pid``; a zombie's status has none: KeyError)."""
    values: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("VmData", "VmSize", "VmPeak"):
                values[key] = int(rest.split()[0]) * 1024
    return VmStatus(values["VmData"], values["VmSize"], values["VmPeak"])


def peak_data_bytes(start: VmStatus, now: VmStatus) -> int:
    """Peak data memory since ``start`` (a probe's first reading in a freshly forked process, or the guard's
    in a job's process).

    VmPeak cannot be reset. A freshly forked process starts it at its size; a process with a past (a job's,
    that mapped a file and closed it) may hold a high-water mark from before ``start``. While ``now`` has not
    passed that mark, the period's own high is unknown and the larger of the two readings' data stands for
    it, rather than the past's mark."""
    if now.peak <= start.peak and start.peak > start.size:
        return max(start.data, now.data)
    growth = now.peak - start.size
    not_data_growth = max(0, now.not_data - start.not_data)
    return start.data + max(0, growth - not_data_growth)


class DataPeak:
    """A process's data high-water mark, read again and again (a probe's steps, the guard's batches, a supervised
    job's samples): the largest of :func:`peak_data_bytes` at each reading where ``VmPeak`` rose since the one
    before, and of the data memory at every reading.

    ``VmPeak`` is the high-water mark of the whole address space; what it holds above the data is known only at a
    reading, as the mappings that are not data then. Those come and go in a training loop: a ``DataLoader`` with
    workers receives each batch as shared memory the worker filled (a mapping the size of the batch, which
    ``RLIMIT_DATA`` does not count), one to three at a time as the workers' batches arrive in order or not, the
    most in the first steps, while the workers start. A batch arrives in the loop's ``next()`` and stays mapped
    through the step, so the reading after a step holds the mappings its peak had: a mark is read with the
    mappings of the reading at which it rose, never with a later one's. Read with a later reading's (as
    :func:`peak_data_bytes` alone was), a mark set under three batches' mappings counted two of them as data:
    peaks that fell from step to step, a step that "raised the peak" by a batch's size, readings above the cap
    the kernel enforces.

    The other way round, a mark set under more such mappings hides a later rise of the data smaller than them
    (the optimizer's state at the second step, under the first step's batches): :attr:`mark_not_data` is what
    :class:`Ballast` keeps the mappings at, so that a rise shows from the next step on.
    ``start``: the first reading of a period (a probe's, in a freshly forked process); None: since the process
    began (its whole ``VmPeak``)."""

    def __init__(self, start: VmStatus | None = None) -> None:
        self.start = start if start is not None else VmStatus(0, 0, 0)
        self.mark = self.start.peak  # VmPeak at the reading that last saw it rise
        self.mark_not_data = self.start.not_data  # the mappings that are not data at that reading
        self.high = self.start.data

    def read(self, now: VmStatus) -> int:
        """The data high-water mark since the start, with ``now`` (a reading of the process's status) seen."""
        if now.peak > self.mark:
            self.high = max(self.high, peak_data_bytes(self.start, now))
            self.mark, self.mark_not_data = now.peak, now.not_data
        self.high = max(self.high, now.data)
        return self.high


class Ballast:
    """Address space that holds no memory: an anonymous mapping without access (``PROT_NONE``: no pages, not data,
    outside ``RLIMIT_DATA``), sized at each reading so that the mappings that are not data stay where they were
    when ``VmPeak`` last rose (:attr:`DataPeak.mark_not_data`). A ``DataLoader``'s first steps hold more of its
    batches' shared mappings than the steps after (its workers' batches arrive together as they start), and a
    mark set under them hid any rise of the data smaller than the batches no longer mapped: the optimizer's state
    at the second step was seen in some probes of one batch and not in others (2.1 MiB at batch 7200 of
    tests/scripts/as_is/loader_workers.py), and a search read that as noise. Held up to the mark's level, the
    mappings let a rise of the data lift the mark again, read at the next step. Not where the address space
    itself is capped (``RLIMIT_AS``: the ballast would count there), which :meth:`CpuBackend.apply` checks."""

    def __init__(self) -> None:
        self._map: mmap.mmap | None = None
        self.size = 0

    def hold(self, size: int) -> None:
        """Hold ``size`` bytes of address space (rounded up to pages; at or below zero: none), the old mapping
        unmapped first, so that the swap itself never lifts ``VmPeak``."""
        size = -(-max(0, size) // mmap.PAGESIZE) * mmap.PAGESIZE
        if size == self.size:
            return
        if self._map is not None:
            self._map.close()
        self._map, self.size = None, 0
        if size:
            try:
                self._map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=0)
            except OSError:  # no address space for it: the readings go on without
                return
            self.size = size

    def follow(self, meter: DataPeak, now: VmStatus) -> None:
        """Size the ballast after the reading ``now``: the mark's non-data mappings less those there are now
        besides the ballast."""
        self.hold(meter.mark_not_data - (now.not_data - self.size))


@dataclass(frozen=True)
class RunWait:
    """How long this process's threads have waited for a core (run-queue time, ``/proc/self/task/*/schedstat``,
    seconds), and the wall clock when read."""

    waited: float
    wall: float


def read_run_wait() -> RunWait | None:
    """The run-queue time of this process's threads so far (None where the kernel does not report it)."""
    waited, seen = 0, False
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/schedstat") as handle:
                waited += int(handle.read().split()[1])  # ns on the run queue, waiting for a core
                seen = True
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return RunWait(waited / 1e9, time.monotonic()) if seen else None


def waiting_share(start: RunWait | None, end: RunWait | None) -> float | None:
    """How long the threads waited for a core between two readings, over the wall time between them (None
    without both): about 0 when nothing else wanted their cores; a neighbour that keeps one of two cores
    busy reads about 0.9 for torch's two threads here, however many cores others keep busy elsewhere.

    The run-queue times are summed over the threads, so threads that wait at once add up past the wall time
    (1.5-1.7 for two on a loaded machine here); a share, it stops at 1: all of the time."""
    if start is None or end is None or end.wall <= start.wall:
        return None
    return min(1.0, max(0.0, end.waited - start.waited) / (end.wall - start.wall))


#: glibc's ``mallopt`` parameter (malloc.h) for each of :data:`MALLOC_ENV`'s variables.
MALLOPT_OF = {"MALLOC_ARENA_MAX": -8, "MALLOC_MMAP_THRESHOLD_": -3}


def hold_environment_here(environment: Mapping[str, str]) -> bool:
    """Run this process, already started, under a plan's environment (:attr:`Chosen.environment
    <autobatch.records.result.Chosen.environment>`: the CPU's :data:`MALLOC_ENV`) as far as it can be set after
    the start, for the doors that train in the process that tuned (the Lightning callback,
    :func:`autobatch.integrations.hf.apply_to_training_arguments`): glibc's allocator variables through
    ``mallopt`` (glibc reads them only at a process's start), then the free heap given back. From here every
    block of 64 KiB or more is a mapping of its own; the arenas made before stay (a process started with the
    variables has one). False when a variable could not be set (not glibc); True with nothing to set."""
    settings = [(MALLOPT_OF[name], int(value)) for name, value in environment.items() if name in MALLOPT_OF]
    if not settings:
        return True
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    done = all(mallopt(param, value) == 1 for param, value in settings)
    release_heap()
    return done


def release_heap() -> None:
    """Collect garbage and give glibc's free heap back to the system (``malloc_trim``; nothing elsewhere)."""
    import gc

    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def apply_cap(budget_bytes: int) -> None:
    """Cap this process's data memory (RLIMIT_DATA, soft and hard) at the budget, never above the hard limit the
    process was started with (a job's ``ulimit -d``: raising it is refused). A budget at or below zero (a
    fresh-process offset larger than the budget) allows no more data: ``setrlimit`` would take a negative value
    as an unsigned one, no cap at all."""
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    cap = under_hard(max(0, budget_bytes), hard)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))


def under_hard(value: int, hard: int) -> int:
    """``value`` as a resource limit a process may set under its ``hard`` one (raising that is refused); either
    may be ``RLIM_INFINITY``."""
    if hard == resource.RLIM_INFINITY:
        return value
    return hard if value == resource.RLIM_INFINITY else min(value, hard)


class ProcessLimit(NamedTuple):
    """The most data memory this process's own resource limits let it hold (bytes), and which limit says so."""

    bytes: int
    name: str  # "RLIMIT_DATA (ulimit -d)" or "RLIMIT_AS (ulimit -v)"


def process_limit(status: VmStatus | None = None) -> ProcessLimit | None:
    """What this process's soft resource limits leave for its data memory, a job started from the same shell
    inheriting them (a job script's ``ulimit``, limits SLURM carries over from where the job was submitted), or
    None when neither is set. ``RLIMIT_DATA`` bounds data memory itself; ``RLIMIT_AS`` the whole address space,
    of which the process's mappings that are not data (its libraries, mapped files: ``status``, read now when
    not given) take their share first."""
    found = []
    data, _ = resource.getrlimit(resource.RLIMIT_DATA)
    if data != resource.RLIM_INFINITY:
        found.append(ProcessLimit(data, "RLIMIT_DATA (ulimit -d)"))
    space, _ = resource.getrlimit(resource.RLIMIT_AS)
    if space != resource.RLIM_INFINITY:
        not_data = (status or read_status()).not_data
        found.append(ProcessLimit(max(0, space - not_data), "RLIMIT_AS (ulimit -v)"))
    return min(found, default=None)


#: The environment a CPU process's memory depends on: the allocator, the thread pools, what it imports.
ENV_PREFIXES = (
    "MALLOC_",
    "GLIBC_TUNABLES",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "OMP_",
    "MKL_",
    "KMP_",
    "PYTORCH_",
)
ENV_NAMES = ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE")


def environment() -> dict[str, str]:
    """The variables of this process's environment that a CPU process's memory depends on."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}


def cores() -> int:
    """The cores this process may run on (its CPU affinity: ``taskset``, a job's CPU binding): unless told
    otherwise (``OMP_NUM_THREADS``), torch starts a thread per core, and each holds memory of its own (a tune of
    examples/mlp.py under 600 MiB found 161 bound to one core of two, 134 on both)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_memory() -> dict[str, Any]:
    """The machine's memory as the inspection reports it (``available_bytes``, ``total_bytes``), bounded by this
    process's memory cgroup and its own resource limits (:func:`within`): what a replayed inspection reads again
    (:meth:`autobatch.probe.client.ProbeClient.run`)."""
    import psutil

    from autobatch.devices.cgroup import cgroup_memory

    memory = psutil.virtual_memory()
    host = {"available_bytes": int(memory.available), "total_bytes": int(memory.total)}
    return within(host, cgroup=cgroup_memory(), limit=process_limit())


#: The keys :func:`within` adds: what bounded the figures, and the figures of the bounds that did.
BOUND_KEYS = (
    "total_by",
    "available_by",
    "host_available_bytes",
    "cgroup_limit_bytes",
    "cgroup_used_bytes",
    "process_limit_bytes",
    "process_limit_name",
)


def within(
    found: Mapping[str, Any], *, cgroup: CgroupMemory | None = None, limit: ProcessLimit | None = None
) -> dict[str, Any]:
    """``found`` (the memory a process here may take: ``total_bytes``, ``available_bytes``) bounded by a memory
    ``cgroup`` (its limit bounds the total, its room what is available) and by the process's resource ``limit``
    (both). ``total_by`` and ``available_by`` name the bound that decided each ("cgroup", "process"; absent: the
    host's figure), with that bound's own figures for the device's notes: ``host_available_bytes``,
    ``cgroup_limit_bytes``, ``cgroup_used_bytes``; ``process_limit_bytes``, ``process_limit_name``."""
    bounded = dict(found)
    if cgroup is not None:
        details = {
            "cgroup_limit_bytes": cgroup.limit_bytes,
            "cgroup_used_bytes": cgroup.used_bytes,
            "host_available_bytes": found.get("host_available_bytes", found["available_bytes"]),
        }
        _lower(bounded, "cgroup", cgroup.limit_bytes, cgroup.room_bytes, details)
    if limit is not None:
        details = {"process_limit_bytes": limit.bytes, "process_limit_name": limit.name}
        _lower(bounded, "process", limit.bytes, limit.bytes, details)
    return bounded


def _lower(found: dict[str, Any], by: str, total: int, available: int, details: Mapping[str, Any]) -> None:
    lowered = False
    if total < found.get("total_bytes", total + 1):
        found.update(total_bytes=total, total_by=by)
        lowered = True
    if available < found["available_bytes"]:
        found.update(available_bytes=available, available_by=by)
        lowered = True
    if lowered:
        found.update(details)


class CpuBackend:
    """The CPU device in a probe process (:class:`~autobatch.devices.backend.DeviceBackend`)."""

    fresh_process_differs = True
    job_environment: Mapping[str, str] = MALLOC_ENV
    ranks_share_memory = True

    def __init__(self) -> None:
        self.data_peak: DataPeak | None = None
        self.ballast: Ballast | None = None
        # a peak is read in the script's other threads too (where an out-of-memory error is raised)
        self._reading = threading.Lock()
        self.offset = 0

    def apply(self, request: ProbeRequest, outcome: ProbeOutcome) -> None:
        """Cap the data memory at the budget, counted as the job's fresh process would count it
        (:mod:`autobatch.probe.fresh`): this forked process holds ``offset`` less than that one at the same
        step, so its cap is that much lower and its readings higher. A timing probe measures the step as the
        job's allocator runs it, and its cap leaves room for that heap."""
        # step times are compared only under the same OpenMP wait policy (autobatch.probe.yielding)
        outcome.omp_wait_policy = os.environ.get("OMP_WAIT_POLICY")
        self.offset = request.offset_for()
        apply_cap(request.budget_bytes - self.offset)
        # torch's thread pool is left to start in the first step, as the job's does: started ahead of it (a small
        # product), a process holds 10-30 MiB less after a step than one whose first parallel work is the step
        start = read_status()
        self.data_peak = DataPeak(start)
        space, _ = resource.getrlimit(resource.RLIMIT_AS)
        self.ballast = Ballast() if space == resource.RLIM_INFINITY else None
        outcome.baseline_bytes = start.data + self.offset

    def peak(self) -> int:
        """The data high-water mark since :meth:`apply`, raised by the offset (:class:`DataPeak`; the
        :class:`Ballast` follows each reading)."""
        assert self.data_peak is not None, "apply() first"
        with self._reading:
            now = read_status()
            high = self.data_peak.read(now)
            if self.ballast is not None:
                self.ballast.follow(self.data_peak, now)
        return high + self.offset

    def synchronize(self) -> None:
        """Nothing queued: the CPU's work is done when the call returns."""

    def finish(self, outcome: ProbeOutcome) -> None:
        """Nothing to add: the cap raised where the budget ran out."""

    def load_meter(self) -> Callable[[], float | None]:
        start = read_run_wait()
        return lambda: waiting_share(start, read_run_wait())

    def facts(self, precisions: tuple[str, ...] = ()) -> dict[str, Any]:
        """The memory there is, the baseline a probe starts from, whether torch sees CUDA (what ``auto``
        resolves to), and the precisions a tiny step cannot run here."""
        import torch

        from autobatch.step.loop import tiny_step

        facts: dict[str, Any] = {
            "cuda_available": bool(torch.cuda.is_available()),
            **machine_memory(),
            "baseline_bytes": read_status().data,  # read before the tiny steps below add to it
        }
        unsupported: dict[str, str] = {}
        for precision in precisions:
            try:
                tiny_step(precision)
            except Exception as exc:  # noqa: BLE001
                unsupported[precision] = f"{type(exc).__name__}: {exc}"
        facts["unsupported_precisions"] = unsupported
        return facts
