"""The device a session probes on: its budget (CPU and CUDA side by side) and the one margin rule.

Pure: :func:`device_info` turns what the probe server's ``inspect`` operation reported about the device and
the model into a :class:`DeviceInfo`; each device's budget is one function (:func:`cpu_budget` here,
:func:`autobatch.devices.cuda.cuda_budget` for CUDA); :func:`margin_bytes` is how close to the budget a
fit may come on the CPU, where the same probe's peak differs between fresh processes (docs/how-a-tune-works.md,
"Margin on the CPU").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autobatch.core.units import format_bytes
from autobatch.errors import DeviceError, UsageError
from autobatch.records.result import Circumstance, warning_note
from autobatch.settings.levers import Door, lever, neutral

if TYPE_CHECKING:
    from autobatch.records.protocol import ProbeOutcome


#: The CPU margin's least size: peaks of one probe in fresh processes differ by up to two 1 MiB steps.
CPU_MARGIN_FLOOR = 3 << 20


def margin_bytes(device_type: str, budget_bytes: int) -> int:
    """How close to the budget a peak may come and still count as a fit: :data:`CPU_MARGIN_FLOOR` (two of the
    1 MiB steps a peak differs by between fresh CPU processes, and their spread), or 0.1 % of a larger budget.
    On CUDA the verdict compares allocator statistics: no margin."""
    return max(CPU_MARGIN_FLOOR, budget_bytes // 1000) if device_type == "cpu" else 0


class EarlyWarning:
    """Warns once when a running job's peak comes within :func:`margin_bytes` of its budget, or passes it into
    the headroom: it fits now, and may run out of memory later (``autobatch run`` and the guard both use it). The
    warning says which: how far under the budget, or how far past it."""

    def __init__(self, device_type: str, budget_bytes: int, warn: Callable[[str], object]) -> None:
        self.budget_bytes = budget_bytes
        self.line = budget_bytes - margin_bytes(device_type, budget_bytes)
        self.warn = warn
        self.warned = False

    def check(self, peak_bytes: int | None) -> bool:
        """Warn if ``peak_bytes`` reached the line and nothing was said yet; whether it warned now."""
        if self.warned or peak_bytes is None or peak_bytes < self.line:
            return False
        self.warned = True
        budget = format_bytes(self.budget_bytes)
        if peak_bytes > self.budget_bytes:
            past = format_bytes(peak_bytes - self.budget_bytes)
            where = f"{past} past its budget {budget}, into the headroom: it still runs, and"
        elif peak_bytes == self.budget_bytes:
            where = f"its budget {budget}: it"
        else:
            where = (
                f"{format_bytes(self.budget_bytes - peak_bytes)} under its budget {budget} (the warning's margin is "
                f"{format_bytes(self.budget_bytes - self.line)}): it"
            )
        self.warn(f"the job's peak reached {format_bytes(peak_bytes)}, {where} may run out of memory later")
        return True


#: Memory other processes hold that is worth a warning: at least this, or 0.5 % of the capacity.
OTHERS_WARN_BYTES = 64 << 20


def others_warning(device: str, others_bytes: int, capacity_bytes: int, subtracted: bool) -> str | None:
    """The warning about memory other processes hold on a GPU (None below the threshold)."""
    if others_bytes < max(OTHERS_WARN_BYTES, capacity_bytes // 200):
        return None
    how = (
        "subtracted from the budget, so the maxima are smaller than on a free GPU"
        if subtracted
        else f"not subtracted ({neutral('memory')} calibrates for a dedicated card), but it must fit beside them"
    )
    return Circumstance(
        f"other processes hold {format_bytes(others_bytes)} on {device}: {how}; `autobatch devices` "
        "lists them"
    )


def growth_tolerance(budget_bytes: int) -> int:
    """How much a step's peak may exceed the previous one and still count as settled (any device)."""
    return max(1 << 20, budget_bytes // 1000)


@dataclass
class DeviceInfo:
    """The device of a session, its budget, and what inspecting the model told about both."""

    type: str  # "cpu" | "cuda"
    name: str  # "cpu" | "cuda:0"
    capacity_bytes: int
    budget_bytes: int
    headroom: float
    memory_definition: str
    unsupported_precisions: dict[str, str] = field(default_factory=dict)
    recompute_blocks: list[str] = field(default_factory=list)
    recompute_counts: dict[str, int] = field(default_factory=dict)  # how many of each block class
    param_shapes: list[list[int]] = field(default_factory=list)
    param_count: int = 0
    block_params: list[int] = field(default_factory=list)  # each repeated block's parameter count
    baseline_bytes: int | None = None
    notes: list[str] = field(default_factory=list)
    process_limit_bytes: int | None = None  # CUDA: all a probe process may hold (NVML); None: not checked
    others_bytes: int | None = None  # CUDA: memory other processes held on the device at the start
    warnings: list[str] = field(default_factory=list)  # also in notes; shown as warnings
    requested: str | None = None  # the --device asked for ("auto", "cpu", "cuda:1"); None: not recorded
    # CPU: the job's fresh process measured against a forked probe (autobatch.probe.fresh); empty: not measured
    fresh_process: dict[str, Any] = field(default_factory=dict)
    # CUDA: the allocator's settings in effect in the probes, as torch reports them; empty: not reported
    allocator: dict[str, Any] = field(default_factory=dict)
    # CPU: the room of the memory cgroup that bounds the job, when it bounded the capacity (autobatch.devices.cgroup)
    cgroup_room_bytes: int | None = None
    # CPU: what the script's own processes (DataLoader workers) held, taken off the capacity to fit that cgroup
    workers_bytes: int | None = None

    @property
    def fell_back(self) -> bool:
        """``--device auto`` found no CUDA device and took the CPU."""
        return self.requested == "auto" and self.type == "cpu"

    @property
    def margin_bytes(self) -> int:
        return margin_bytes(self.type, self.budget_bytes)

    @property
    def margin_line(self) -> int | None:
        """The line a search's peak must stay under, the budget less the margin (None: no margin, CUDA). A
        probe may stop at the step that crosses it: a high-water mark only rises."""
        return self.budget_bytes - self.margin_bytes if self.margin_bytes else None

    def too_close(self, peak_bytes: int | None) -> bool:
        """Whether a peak that fitted came within :attr:`margin_bytes` of the budget."""
        margin = self.margin_bytes
        return bool(margin and (peak_bytes or 0) > self.budget_bytes - margin)

    def warn(self, message: str) -> None:
        """A warning about the device: shown, and kept in the result's notes."""
        self.warnings.append(message)
        self.notes.append(warning_note(message))

    def unsupported(self, precision: str) -> str | None:
        """Why this device cannot run ``precision`` (None when it can): the one precision-support check."""
        why = self.unsupported_precisions.get(precision)
        return f"{self.name} cannot run {precision}: {why}" if why else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "name": self.name,
            "requested": self.requested,
            "capacity_bytes": self.capacity_bytes,
            "budget_bytes": self.budget_bytes,
            "headroom": self.headroom,
            "memory_definition": self.memory_definition,
            "baseline_bytes": self.baseline_bytes,
            "process_limit_bytes": self.process_limit_bytes,
            "others_bytes": self.others_bytes,
            **({"fresh_process": self.fresh_process} if self.fresh_process else {}),
            **({"allocator": self.allocator} if self.allocator else {}),
            **({"cgroup_room_bytes": self.cgroup_room_bytes} if self.cgroup_room_bytes is not None else {}),
            **({"workers_bytes": self.workers_bytes} if self.workers_bytes is not None else {}),
        }


def cpu_budget(capacity_bytes: int, headroom: float, baseline_bytes: int | None, door: Door = "cli") -> int:
    """``capacity x (1 - headroom)``; refused when it leaves nothing above the probe process itself (the fix
    named as ``door`` names it)."""
    budget = int(capacity_bytes * (1 - headroom))
    if baseline_bytes and budget <= baseline_bytes:
        raise UsageError(
            f"the CPU budget {format_bytes(budget)} is below what a probe process holds before building the model "
            f"({format_bytes(baseline_bytes)}: Python, torch and the script)",
            hint=f"raise {lever(door, 'memory')}: on the CPU device it caps the whole probe process, imports included",
        )
    return budget


def make_room_for_workers(device: DeviceInfo, own_bytes: int, processes: int) -> bool:
    """Lower a CPU device's capacity and budget so that the job's process and the processes its script starts
    (``processes`` of them, DataLoader workers, holding ``own_bytes`` of their own as measured) fit together in
    the memory cgroup that bounds the job; whether it lowered them (a note says by how much and why).

    On the CPU device the budget is the data memory of the process that trains, each process under its own cap
    (``RLIMIT_DATA``, as ``ulimit -d``): the workers' memory is theirs. A memory cgroup (a container's limit, a
    SLURM job's ``--mem``) counts every process in it, and past its limit the kernel kills one: there the
    capacity is the cgroup's room less the workers' memory. Nothing is lowered where no cgroup bounds the
    capacity, or where the capacity asked for (``--memory``) leaves the workers room beside it."""
    room = device.cgroup_room_bytes
    if device.type != "cpu" or room is None or own_bytes <= 0:
        return False
    over = device.capacity_bytes + own_bytes - room
    if over <= 0:
        return False
    before = device.budget_bytes
    capacity = device.capacity_bytes - over
    device.budget_bytes = cpu_budget(capacity, device.headroom, device.baseline_bytes)
    device.capacity_bytes, device.workers_bytes = capacity, own_bytes
    device.notes.append(
        f"budget {format_bytes(before)} lowered to {format_bytes(device.budget_bytes)} (capacity "
        f"{format_bytes(capacity)}): the {processes} process(es) the script started (DataLoader workers, ...) held "
        f"{format_bytes(own_bytes)} of their own when the job's process was measured, and the memory cgroup that "
        f"bounds the job ({format_bytes(room)} of room) counts them beside it; they hold the batches they prepare, "
        "so a larger batch's workers hold more (a probe whose workers held more than that is warned of)"
    )
    return True


def workers_outgrew(device: DeviceInfo, outcome: ProbeOutcome, door: Door = "cli") -> str | None:
    """The warning when a probe's processes of the script's own (DataLoader workers) held more than the room
    :func:`make_room_for_workers` left them, by more than the margin (None otherwise): they hold the batches they
    prepare, so a larger batch's workers hold more than those measured at the job's process's small batch."""
    own, room = outcome.info.get("child_own_bytes"), device.workers_bytes
    if not (own and room and own > room + device.margin_bytes):
        return None
    return (
        f"at batch {outcome.batch_size} the script's processes (DataLoader workers, ...) held {format_bytes(own)} "
        f"of their own, {format_bytes(own - room)} more than the budget left them in the job's memory cgroup: a "
        "job whose own process comes near the budget may pass the cgroup's limit with them, where the kernel kills "
        f"a process; to leave them that room, tune with {lever(door, 'memory', format_bytes(device.capacity_bytes - own + room))}"
    )


def check_cpu_memory(memory: int | None, info: dict[str, Any], door: Door = "cli") -> None:
    """Refuse a CPU ``--memory`` above the most a process here can hold (the machine's physical memory, its
    memory cgroup's limit, or its own resource limits: ``info`` as :func:`autobatch.devices.cpu.machine_memory`
    reports it): the cap (RLIMIT_DATA) could never be what stops a probe; the kernel's out-of-memory killer would,
    which reads as a crash, or the job's own limit, which the probe's cap would have lifted."""
    total = info.get("total_bytes")
    if not (memory and total and memory > total):
        return
    asked = lever(door, "memory", format_bytes(memory))
    if info.get("total_by") == "process":
        raise UsageError(
            f"{asked} is more than this process's {info['process_limit_name']} lets it "
            f"hold ({format_bytes(total)}), which the job started from this shell inherits: a probe would measure "
            "memory the job cannot have",
            hint=f"pass at most {format_bytes(total)}, or raise the limit (`ulimit -S -d unlimited`, `ulimit -S -v "
            "unlimited`, within the hard limit) where the job runs too",
        )
    what = (
        f"the job's memory cgroup allows ({format_bytes(total)}: a container's limit or a job's --mem)"
        if info.get("total_by") == "cgroup"
        else f"this machine's physical memory ({format_bytes(total)})"
    )
    raise UsageError(
        f"{asked} is more than {what}: on the CPU device the cap could never be reached",
        hint=f"pass at most {format_bytes(total)} (leave {lever(door, 'memory')} unset to use the memory available now); "
        "to plan for a bigger machine, use `autobatch estimate --memory`",
    )


def capacity_note(info: dict[str, Any]) -> str | None:
    """What the device's capacity came from when the process's own limits or its memory cgroup left less than
    the host has available."""
    if info.get("available_by") == "process":
        return (
            f"capacity: what this process's {info['process_limit_name']} leaves for its data memory "
            f"({format_bytes(info['process_limit_bytes'])}), less than there is room for; the job started from "
            "this shell inherits the limit, and past it an allocation fails"
        )
    if info.get("available_by") != "cgroup":
        return None
    return (
        f"capacity: the room left in the job's memory cgroup ({format_bytes(info['available_bytes'])}: "
        f"limit {format_bytes(info['cgroup_limit_bytes'])}, {format_bytes(info['cgroup_used_bytes'])} in use, "
        "this tune's own processes included), less than the host's "
        f"{format_bytes(info['host_available_bytes'])} available; a container's limit or a job's --mem, which the "
        f"kernel enforces by killing a process; pass {neutral('memory')} for the job's own share"
    )


def device_info(
    device: str, info: dict[str, Any], *, memory: int | None, headroom: float, door: Door = "cli"
) -> DeviceInfo:
    """The :class:`DeviceInfo` of ``device`` ("cpu" or "cuda:N") from an ``inspect`` answer; its refusals name
    ``--memory`` as ``door`` does."""
    common: dict[str, Any] = {
        "unsupported_precisions": dict(info.get("unsupported_precisions", {})),
        "recompute_blocks": list(info.get("recompute_blocks", [])),
        "recompute_counts": {str(k): int(n) for k, n in info.get("recompute_counts", {}).items()},
        "param_shapes": [list(s) for s in info.get("param_shapes", [])],
        "param_count": int(info.get("param_count", 0)),
        "block_params": [int(n) for n in info.get("block_params", [])],
    }
    if device == "cpu":
        from autobatch.devices.cgroup import job_cgroup
        from autobatch.devices.cpu import MEMORY_DEFINITION, within

        info = within(
            info, cgroup=job_cgroup()
        )  # the job's cgroup, where the probes run in another (the daemon's)
        capacity = memory or int(info["available_bytes"])
        check_cpu_memory(memory, info, door)
        baseline = info.get("baseline_bytes")
        budget = cpu_budget(capacity, headroom, baseline, door)
        room = (
            info["cgroup_limit_bytes"] - info["cgroup_used_bytes"] if "cgroup_limit_bytes" in info else None
        )
        info_ = DeviceInfo(
            "cpu",
            "cpu",
            capacity,
            budget,
            headroom,
            MEMORY_DEFINITION,
            baseline_bytes=baseline,
            cgroup_room_bytes=max(0, room) if room is not None else None,
            **common,
        )
        available = info.get("available_bytes")
        where = {
            "cgroup": "its memory cgroup has room for",
            "process": f"its {info.get('process_limit_name')} leaves",
        }.get(info.get("available_by", ""), "the host has available")
        if memory and available and memory > int(available):
            info_.warn(
                Circumstance(  # the machine's memory when it measured
                    f"{lever(door, 'memory', format_bytes(memory))} is more than {where} now "
                    f"({format_bytes(int(available))}): a probe may be killed for want of memory before it "
                    "reaches the cap"
                )
            )
        elif memory is None and (note := capacity_note(info)):
            info_.notes.append(note)
        return info_
    from autobatch.devices import cuda

    snapshot = cuda.CudaSnapshot.from_dict(info["snapshot"])
    found = cuda.cuda_budget(snapshot, memory=memory, headroom=headroom)
    info_ = DeviceInfo(
        "cuda",
        device,
        found.capacity_bytes,
        found.budget_bytes,
        headroom,
        cuda.MEMORY_DEFINITION,
        notes=[*found.breakdown, *snapshot.notes],  # how the budget was reached; what NVML could not tell
        process_limit_bytes=found.process_limit_bytes,
        others_bytes=found.held_by_others_bytes,
        allocator=dict(snapshot.allocator_effective),
        **common,
    )
    warning = others_warning(device, found.held_by_others_bytes, found.total_bytes, not found.calibrated)
    if warning:
        info_.warn(warning)
    for mismatch in cuda.allocator_mismatches(snapshot.allocator_asked, snapshot.allocator_effective):
        info_.warn(mismatch)
    return info_


def cuda_name(device: str) -> str:
    """``cuda`` -> ``cuda:0``; ``cuda:N`` as is; anything else is refused."""
    if device == "cuda":
        return "cuda:0"
    if not device.startswith("cuda:") or not device[5:].isdigit():
        raise DeviceError(f"unknown device {device!r}", hint="use auto, cpu, cuda or cuda:N")
    return device


def apply_margin(outcome: ProbeOutcome, device: DeviceInfo) -> bool:
    """Turn a fit whose peak came within the device's margin of the budget into an out-of-memory outcome.

    Returns whether it did. The search never stands on a batch that fitted by less than the variation
    between processes (the module docstring).
    """
    if not (outcome.fits and device.too_close(outcome.peak_bytes)):
        return False
    outcome.kind = "oom"
    outcome.reason = margin_reason(
        device.margin_bytes, outcome.peak_bytes, device.budget_bytes, "a fresh process can exceed the budget"
    )
    return True


def margin_reason(margin_bytes: int, peak_bytes: int | None, budget_bytes: int, why: str) -> str:
    """Why a probe that fitted the budget by less than the margin counts as out of memory (after the probe,
    :func:`apply_margin`; or when a search probe stopped at the margin's line, :mod:`autobatch.probe.worker`)."""
    if peak_bytes is not None and peak_bytes > budget_bytes:  # past the budget: no margin is left to speak of
        return (
            f"peaked {format_bytes(peak_bytes)}, {format_bytes(peak_bytes - budget_bytes)} above the budget of "
            f"{format_bytes(budget_bytes)}: it does not fit"
        )
    return (
        f"fitted by less than the {format_bytes(margin_bytes)} margin (peak {format_bytes(peak_bytes)} of "
        f"{format_bytes(budget_bytes)}): {why}"
    )
