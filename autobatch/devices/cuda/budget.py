"""The CUDA budget and the verdict on a step: pure arithmetic over figures read elsewhere.

:func:`cuda_budget` turns capacity, other processes' memory and the CUDA context into the budget the
allocator cap enforces; :func:`judge_step` says whether a step fit. Dataclasses in, numbers and verdicts out, no
torch and no pynvml: the figures come from :mod:`.runtime` (torch.cuda) and :mod:`.nvml` (pynvml). The
definition and every term: docs/how-a-tune-works.md ("The CUDA budget in detail").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from autobatch.core.units import format_bytes
from autobatch.errors import DeviceError, UsageError
from autobatch.settings.levers import neutral

MiB = 1 << 20
#: The CUDA context assumed when it cannot be measured (NVML cannot see this PID).
DEFAULT_CONTEXT_BYTES = 512 * MiB

MEMORY_DEFINITION = (
    "cuda: memory reserved by PyTorch's caching allocator (max_memory_reserved), capped with "
    "torch.cuda.set_per_process_memory_fraction at (capacity - other processes - CUDA context) x (1 - headroom)"
)


@dataclass(frozen=True)
class CudaSnapshot:
    """What the device looks like at probe start (bytes). Crosses processes via to_dict/from_dict."""

    device_index: int
    name: str
    total_bytes: int  # torch.cuda.mem_get_info
    free_bytes: int  # torch.cuda.mem_get_info
    torch_reserved_bytes: int = 0  # reserved by this process's caching allocator when taken
    nvml_used_by_others_bytes: int | None = None  # other PIDs (None: unknown or our PID not visible)
    nvml_device_used_bytes: int | None = None  # nvml.device_memory().used: recorded, never subtracted
    nvml_process_bytes: int | None = None  # this PID, None when NVML cannot see it
    context_bytes: int = DEFAULT_CONTEXT_BYTES
    context_source: str = "estimate"  # "nvml" (measured) | "estimate"
    uuid: str | None = None
    pci_bus_id: str | None = None
    notes: tuple[str, ...] = ()
    allocator_asked: dict[str, str] = field(
        default_factory=dict
    )  # ALLOC_CONF_VARIABLES set in the probe process
    allocator_effective: dict[str, Any] = field(
        default_factory=dict
    )  # runtime.allocator_settings(): torch's word

    @property
    def outside_bytes(self) -> int:
        """Memory in use on the device that this process's caching allocator does not hold, by CUDA's own count
        (``cudaMemGetInfo``: total less free), the count the capacity is in. NVML's device-level ``used`` is not
        on that footing: it adds the memory the driver and firmware reserve, which CUDA's total already leaves
        out (hundreds of MiB on an idle GPU), so it would be counted as other processes' memory."""
        return max(0, self.total_bytes - self.free_bytes - self.torch_reserved_bytes)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["notes"] = list(self.notes)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CudaSnapshot:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["notes"] = tuple(values.get("notes", ()))
        return cls(**values)


#: The variables PyTorch's caching allocator reads its settings from. Releases differ in which one wins when both
#: are set (2.13 reads PYTORCH_CUDA_ALLOC_CONF first, others PYTORCH_ALLOC_CONF), so what is in effect is torch's
#: word (:func:`autobatch.devices.cuda.runtime.allocator_settings`), never guessed from these.
ALLOC_CONF_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def asked_settings(conf: str) -> dict[str, str]:
    """``expandable_segments:True,max_split_size_mb:128`` -> ``{"expandable_segments": "True", ...}`` (a list
    in brackets, ``roundup_power2_divisions:[256:1,>:2]``, kept whole; a key given twice: its last value)."""
    items, depth, start = [], 0, 0
    for at, char in enumerate(conf + ","):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth <= 0:
            items.append(conf[start:at])
            start = at + 1
    asked = {}
    for item in items:
        key, colon, value = item.partition(":")
        if colon and key.strip():
            asked[key.strip()] = value.strip()
    return asked


def allocator_mismatches(asked: Mapping[str, str], effective: Mapping[str, Any]) -> list[str]:
    """What the allocator variables ``asked`` for (variable -> settings) and the allocator does not run with, as
    torch reports it (``effective``: ``expandable_segments``, ``backend``; a setting torch does not report is not
    judged). Expandable segments on that no variable asked for are said too (set at run time)."""
    said = []
    other = ", or the other variable, also set, read first" if len(asked) > 1 else ""
    for variable, conf in asked.items():
        wanted = asked_settings(conf)
        want = wanted.get("expandable_segments")
        runs = effective.get("expandable_segments")
        if want in ("True", "False") and runs is not None and (want == "True") != bool(runs):
            how = (
                f"with expandable segments (set at run time, by the script or a library{other})"
                if runs
                else f"without expandable segments (a torch build, platform or driver without them{other})"
            )
            said.append(
                f"{variable} asks for expandable_segments:{want}, but PyTorch's caching allocator runs {how}: the "
                "maxima are for the allocator as it runs"
            )
        backend, runs_on = wanted.get("backend"), effective.get("backend")
        if backend in ("native", "cudaMallocAsync") and runs_on is not None and backend != runs_on:
            said.append(
                f"{variable} asks for backend:{backend}, but PyTorch's CUDA allocator is {runs_on}: the maxima are "
                "for the allocator as it runs"
            )
    if effective.get("expandable_segments") and not any(
        "expandable_segments" in asked_settings(conf) for conf in asked.values()
    ):
        said.append(
            "PyTorch's caching allocator runs with expandable segments, which no allocator variable asks for (set "
            "at run time, by the script or a library): the maxima are for the allocator as it runs"
        )
    return said


def estimate_context(nvml_process_bytes: int | None, torch_reserved_bytes: int) -> tuple[int, str]:
    """The CUDA context: NVML's figure for this process less PyTorch's reserve, else the estimate."""
    if nvml_process_bytes is None:
        return DEFAULT_CONTEXT_BYTES, "estimate"
    return max(0, nvml_process_bytes - torch_reserved_bytes), "nvml"


@dataclass(frozen=True)
class Budget:
    """The CUDA budget and how it was reached (bytes)."""

    total_bytes: int
    capacity_bytes: int
    others_bytes: int  # subtracted for other processes (0 when calibrated with --memory)
    context_bytes: int
    headroom: float
    budget_bytes: int
    fraction: float  # for torch.cuda.set_per_process_memory_fraction (of total_bytes)
    calibrated: bool
    breakdown: tuple[str, ...]
    held_by_others_bytes: int = 0  # what other processes hold on this GPU (also when calibrating)

    @property
    def process_limit_bytes(self) -> int:
        """All this process may hold on the device, CUDA context included, before headroom."""
        return self.capacity_bytes - self.others_bytes


def cuda_budget(snapshot: CudaSnapshot, *, memory: int | None, headroom: float) -> Budget:
    """Capacity (total, or ``memory``) minus other processes and the context, times (1 - headroom)."""
    if not 0.0 <= headroom < 1.0:
        raise UsageError(f"headroom must be in [0, 1), got {headroom}", hint="for example --headroom 0.1")
    dev = f"cuda:{snapshot.device_index}"
    total, context = snapshot.total_bytes, snapshot.context_bytes
    others_here = max(snapshot.nvml_used_by_others_bytes or 0, snapshot.outside_bytes - context, 0)
    context_how = (
        "measured with NVML"
        if snapshot.context_source == "nvml"
        else "estimate: NVML did not measure this process"
    )
    if memory is None:
        capacity, others, calibrated = total, others_here, False
        lines = [f"capacity {format_bytes(total)} ({dev} {snapshot.name} total)"]
        lines.append(f"- other processes {format_bytes(others)} (NVML and device-level used memory)")
    else:
        if memory <= 0:
            raise UsageError(
                f"{neutral('memory')} must be positive, got {memory}",
                hint=f"for example {neutral('memory', '16GiB')}",
            )
        available = total - others_here
        if memory > total:
            raise DeviceError(
                f"{neutral('memory', format_bytes(memory))} is more than {dev} has ({format_bytes(total)} in total)",
                hint=f"give {neutral('memory')} of at most {format_bytes(total)}, or leave it out to use the whole device",
            )
        if memory > available:
            raise DeviceError(
                f"{neutral('memory', format_bytes(memory))} is more than {dev} has available: {format_bytes(others_here)} "
                f"of its {format_bytes(total)} are held by other processes",
                hint=f"give {neutral('memory')} of at most {format_bytes(available)}, or free the GPU (nvidia-smi lists "
                "the processes)",
            )
        capacity, others, calibrated = memory, 0, True
        lines = [f"capacity {format_bytes(memory)} (--memory, calibrating for a smaller card on {dev})"]
        lines.append(f"- other processes 0 B (not on the calibrated card; {format_bytes(others_here)} here)")
    lines.append(f"- CUDA context {format_bytes(context)} ({context_how})")
    usable = capacity - others - context
    budget = int(usable * (1.0 - headroom))
    lines.append(f"x (1 - headroom {headroom:g}) = budget {format_bytes(budget)}")
    if budget <= 0:
        raise DeviceError(
            f"no memory is left for PyTorch on {dev}: " + "; ".join(lines),
            hint="free the GPU (nvidia-smi lists the processes), lower --headroom, or give a larger --memory",
        )
    fraction = min(1.0, budget / total)
    lines.append(f"torch.cuda.set_per_process_memory_fraction({fraction:.6f}) caps reserved memory")
    return Budget(
        total, capacity, others, context, headroom, budget, fraction, calibrated, tuple(lines), others_here
    )


def fraction_for(budget_bytes: int, total_bytes: int) -> float:
    """The per-process memory fraction that caps reserved memory at ``budget_bytes``."""
    if budget_bytes <= 0 or total_bytes <= 0:
        raise DeviceError(
            f"cannot cap CUDA memory at {format_bytes(budget_bytes)} of {format_bytes(total_bytes)}",
            hint="free the GPU, lower --headroom, or give a larger --memory",
        )
    return float(min(1.0, budget_bytes / total_bytes))


@dataclass(frozen=True)
class CudaStepStats:
    """Allocator counters after the steps of one probe, and the process's NVML figure (bytes, counts)."""

    max_allocated: int
    max_reserved: int
    num_alloc_retries: int = 0
    num_ooms: int = 0
    nvml_process_bytes: int | None = None  # None: NVML unavailable or cannot see this PID

    def to_dict(self) -> dict[str, int | None]:
        """The figures under torch's names, as a probe outcome's ``device_stats``."""
        return {
            "max_memory_allocated": self.max_allocated,
            "max_memory_reserved": self.max_reserved,
            "num_alloc_retries": self.num_alloc_retries,
            "num_ooms": self.num_ooms,
            "nvml_process_bytes": self.nvml_process_bytes,
        }


def judge_step(
    stats: CudaStepStats, budget_bytes: int, process_limit_bytes: int | None
) -> tuple[bool, str | None]:
    """Whether steps that completed really fit; ``(False, reason)`` when they were too tight.

    The NVML rule (the whole process against ``process_limit_bytes``, see
    :attr:`Budget.process_limit_bytes`) runs whenever both its figures are known.
    """
    if stats.num_alloc_retries > 0:
        return False, (
            f"allocator had to flush its cache (num_alloc_retries={stats.num_alloc_retries}): too tight"
        )
    if stats.num_ooms > 0:
        return False, (
            f"the allocator raised an out-of-memory error that was caught (num_ooms={stats.num_ooms}, "
            "e.g. cuDNN falling back for want of workspace): too tight"
        )
    if stats.max_reserved > budget_bytes:
        return False, (
            f"reserved {format_bytes(stats.max_reserved)}, over the budget {format_bytes(budget_bytes)}"
        )
    process = stats.nvml_process_bytes
    if process is not None and process_limit_bytes is not None and process > process_limit_bytes:
        return False, (
            f"the process used {format_bytes(process)} on the device (NVML: CUDA context and memory "
            f"outside PyTorch included), over the {format_bytes(process_limit_bytes)} the device leaves it"
        )
    return True, None


def precision_support(name: str, major: int, minor: int, bf16_native: bool) -> dict[str, str | None]:
    """Precision -> why it cannot run on this GPU (None: it can). bf16 must be native (8.0+)."""
    bf16 = None
    if not bf16_native:
        bf16 = (
            f"bf16 is not native on {name} (compute capability {major}.{minor}; needs 8.0+): "
            "PyTorch would emulate it, slowly"
        )
    return {"32-true": None, "16-mixed": None, "bf16-mixed": bf16, "bf16-true": bf16}
