"""The CUDA device: a memory budget PyTorch's caching allocator enforces, and the stats that judge a step.

Definition: on CUDA, a probe's memory is what PyTorch's caching allocator *reserves*
(``max_memory_reserved``: segments, fragmentation included). The budget is::

    budget = (capacity - other processes - CUDA context) x (1 - headroom)

enforced with ``torch.cuda.set_per_process_memory_fraction(budget / total)``, which caps reserved
memory and raises a real ``torch.OutOfMemoryError`` past it. That cap counts neither the CUDA context
(about 300-600 MiB, growing as kernels load lazily; it also holds cuBLAS/cuDNN handles) nor memory
other processes hold, so both are subtracted first:

* **capacity** is the device's total memory, or ``--memory`` to calibrate for a smaller card. A
  calibrated card is taken to be dedicated: other processes on *this* GPU are not subtracted from it,
  but it must fit in what this GPU has available (``memory <= total - other processes``), else
  :func:`cuda_budget` raises :class:`DeviceError` (it does not clamp: a clamped budget would answer for
  a card the user did not ask about).
* **other processes**: the larger of NVML's per-process figures for every PID that is not ours and
  the device-level figure ``total - free - reserved by us - our context`` (which also sees driver
  reservations, display servers and processes NVML hides).
* **CUDA context**: this process's NVML usage minus what PyTorch reserved, measured at probe start;
  when NVML cannot see our PID (containers have their own PID namespace; NVML reports host PIDs) it
  is estimated as :data:`DEFAULT_CONTEXT_BYTES` (512 MiB). Growth after the snapshot (lazy kernel
  loading) is what the headroom absorbs.

A step does not fit when the allocator had to flush its cache to satisfy it
(``num_alloc_retries > 0``), when it raised an OOM that something caught (``num_ooms > 0``, e.g.
cuDNN falling back to a slower algorithm for want of workspace), when reserved memory passed the
budget, or when the whole process (NVML) used more than the device leaves it.

NVML devices are matched to torch devices by UUID (MIG instances by their own ``MIG-`` UUID), then
by PCI bus id, never by index: ``CUDA_VISIBLE_DEVICES`` renumbers torch's devices, not NVML's.

The pure parts (dataclasses in, numbers out) carry the logic and the tests. The runtime parts import
torch and pynvml inside their functions and are kept thin. :func:`snapshot` initialises CUDA: call it
in a probe process, never in a process that forks probes afterwards. Not verified on a GPU here:
the development machines have none (tests marked ``gpu`` run only where CUDA is available).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Any

from ..core.units import format_bytes
from ..errors import DeviceError, UsageError

MiB = 1 << 20
#: The CUDA context assumed when it cannot be measured (NVML cannot see this PID).
DEFAULT_CONTEXT_BYTES = 512 * MiB
#: nvmlDeviceGetMigMode's "enabled".
NVML_DEVICE_MIG_ENABLE = 1

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
    nvml_device_used_bytes: int | None = None  # nvmlDeviceGetMemoryInfo().used
    nvml_process_bytes: int | None = None  # this PID, None when NVML cannot see it
    context_bytes: int = DEFAULT_CONTEXT_BYTES
    context_source: str = "estimate"  # "nvml" (measured) | "estimate"
    uuid: str | None = None
    pci_bus_id: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def outside_bytes(self) -> int:
        """Memory in use on the device that this process's caching allocator does not hold."""
        used = max(self.total_bytes - self.free_bytes, self.nvml_device_used_bytes or 0)
        return max(0, used - self.torch_reserved_bytes)

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

    @property
    def process_limit_bytes(self) -> int:
        """All this process may hold on the device, CUDA context included, before headroom."""
        return self.capacity_bytes - self.others_bytes

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["breakdown"] = list(self.breakdown)
        return data


def cuda_budget(snapshot: CudaSnapshot, *, memory: int | None, headroom: float) -> Budget:
    """Capacity (total, or ``memory``) minus other processes and the context, times (1 - headroom)."""
    if not 0.0 <= headroom < 1.0:
        raise UsageError(f"headroom must be in [0, 1), got {headroom}", hint="for example --headroom 0.1")
    dev = f"cuda:{snapshot.device_index}"
    total, context = snapshot.total_bytes, snapshot.context_bytes
    others_here = max(snapshot.nvml_used_by_others_bytes or 0, snapshot.outside_bytes - context, 0)
    context_how = (
        "measured with NVML" if snapshot.context_source == "nvml" else "estimate: NVML cannot see this PID"
    )
    if memory is None:
        capacity, others, calibrated = total, others_here, False
        lines = [f"capacity {format_bytes(total)} ({dev} {snapshot.name} total)"]
        lines.append(f"- other processes {format_bytes(others)} (NVML and device-level used memory)")
    else:
        if memory <= 0:
            raise UsageError(f"--memory must be positive, got {memory}", hint="for example --memory 16GiB")
        available = total - others_here
        if memory > total:
            raise DeviceError(
                f"--memory {format_bytes(memory)} is more than {dev} has ({format_bytes(total)} in total)",
                hint=f"give --memory of at most {format_bytes(total)}, or leave it out to use the whole device",
            )
        if memory > available:
            raise DeviceError(
                f"--memory {format_bytes(memory)} is more than {dev} has available: {format_bytes(others_here)} "
                f"of its {format_bytes(total)} are held by other processes",
                hint=f"give --memory of at most {format_bytes(available)}, or free the GPU (nvidia-smi lists "
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
    return Budget(total, capacity, others, context, headroom, budget, fraction, calibrated, tuple(lines))


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
    """Allocator counters after the steps of one probe (bytes and counts)."""

    max_allocated: int
    max_reserved: int
    num_alloc_retries: int = 0
    num_ooms: int = 0
    nvml_process_bytes: int | None = None


def judge_step(stats: CudaStepStats, budget: Budget | int) -> tuple[bool, str | None]:
    """Whether steps that completed really fit; ``(False, reason)`` when they were too tight."""
    budget_bytes = budget.budget_bytes if isinstance(budget, Budget) else int(budget)
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
    if isinstance(budget, Budget) and stats.nvml_process_bytes is not None:
        if stats.nvml_process_bytes > budget.process_limit_bytes:
            return False, (
                f"the process used {format_bytes(stats.nvml_process_bytes)} on the device (NVML: CUDA "
                f"context and memory outside PyTorch included), over the "
                f"{format_bytes(budget.process_limit_bytes)} the device leaves it"
            )
    return True, None


# --- NVML (pynvml from nvidia-ml-py), written against its documented functions --------------------


def normalize_uuid(uuid: str | bytes) -> str:
    """``GPU-8f0c...`` / ``MIG-...`` / torch's bare ``8f0c...`` -> ``8f0c...`` (lower case)."""
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    text = text.strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text


def format_pci_bus_id(domain: int, bus: int, device: int) -> str:
    """NVML's bus id format, ``00000000:65:00.0``, from CUDA's pciDomainID/pciBusID/pciDeviceID."""
    return f"{domain:08X}:{bus:02X}:{device:02X}.0"


def _errors(nvml: Any) -> tuple[type[BaseException], ...]:
    found = [getattr(nvml, n, None) for n in ("NVMLError", "NVMLLibraryMismatchError")]
    return tuple(e for e in found if isinstance(e, type) and issubclass(e, BaseException))


def _device_handles(nvml: Any) -> Iterator[Any]:
    """Every physical device handle, then the MIG device handles of devices with MIG enabled."""
    errors = _errors(nvml)
    no_mig: tuple[type[BaseException], ...] = (*errors, AttributeError)
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except errors:  # no permission on that device: it cannot be ours
            continue
        yield handle
        try:
            if nvml.nvmlDeviceGetMigMode(handle)[0] != NVML_DEVICE_MIG_ENABLE:
                continue
            slots = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
        except no_mig:  # no MIG support (old GPU, old pynvml)
            continue
        for slot in range(slots):
            try:
                yield nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except errors:  # empty slot
                continue


def pick_nvml_handle(nvml: Any, torch_uuid: str | None, pci_bus_id: str | None) -> Any | None:
    """The NVML handle of torch's device: by UUID (physical or MIG), else by PCI bus id, else None.

    Never by index. The PCI fallback finds the physical GPU; when that GPU has MIG enabled, the
    instance is unknown and None is returned (callers then use torch's device-level figures).
    """
    errors = _errors(nvml)
    no_mig: tuple[type[BaseException], ...] = (*errors, AttributeError)
    if torch_uuid:
        wanted = normalize_uuid(torch_uuid)
        try:
            for handle in _device_handles(nvml):
                try:
                    if normalize_uuid(nvml.nvmlDeviceGetUUID(handle)) == wanted:
                        return handle
                except errors:
                    continue
        except errors:
            pass
    if pci_bus_id:
        try:
            handle = nvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
        except errors:
            return None
        try:
            if nvml.nvmlDeviceGetMigMode(handle)[0] == NVML_DEVICE_MIG_ENABLE:
                return None
        except no_mig:
            pass
        return handle
    return None


def _field(process: Any, name: str) -> Any:
    return process.get(name) if isinstance(process, dict) else getattr(process, name, None)


def running_processes(nvml: Any, handle: Any) -> dict[int, int | None]:
    """PID -> used bytes (None: not available) of compute and graphics processes on the device.

    ``nvmlDeviceGetComputeRunningProcesses`` is the v3 call in current nvidia-ml-py; with a driver
    that lacks it (``NVMLLibraryMismatchError``/``FunctionNotFound``) the ``_v2`` call is used. Each
    entry has ``pid`` and ``usedGpuMemory`` (None when NVML cannot tell, e.g. WDDM or some MIG setups).
    """
    errors = _errors(nvml)
    calls = ["nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"]
    procs: list[Any] = []
    for name in calls:
        fn = getattr(nvml, name, None)
        if fn is None:
            continue
        try:
            procs = list(fn(handle))
            break
        except errors:
            if name == calls[-1]:
                raise
    graphics = getattr(nvml, "nvmlDeviceGetGraphicsRunningProcesses", None)
    if graphics is not None:
        try:
            procs += list(graphics(handle))
        except errors:
            pass
    usage: dict[int, int | None] = {}
    for proc in procs:
        pid, used = _field(proc, "pid"), _field(proc, "usedGpuMemory")
        if pid is None:
            continue
        if used is None or usage.get(int(pid), 0) is None:
            usage[int(pid)] = None
        else:  # a process listed as both compute and graphics: the same memory, take the larger
            usage[int(pid)] = max(int(used), usage.get(int(pid)) or 0)
    return usage


def process_memory(nvml: Any, handle: Any, pid: int) -> int | None:
    """This PID's used device memory per NVML; None when NVML does not list it or cannot tell."""
    return running_processes(nvml, handle).get(pid)


def others_memory(nvml: Any, handle: Any, pid: int) -> int | None:
    """Memory held by every other PID; None unless our PID is visible (else PIDs are the host's)."""
    usage = running_processes(nvml, handle)
    if usage.get(pid) is None or any(used is None for p, used in usage.items() if p != pid):
        return None
    return sum(used or 0 for p, used in usage.items() if p != pid)


def nvml_available() -> tuple[bool, str]:
    """Whether NVML can be used here, and why not (no nvidia-ml-py, no driver, no library)."""
    try:
        import pynvml
    except ImportError as exc:
        return False, f"pynvml is not importable ({exc}): pip install nvidia-ml-py"
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError) as exc:
        return False, f"NVML cannot start: {exc} (no NVIDIA driver on this machine?)"
    try:
        return True, f"NVML sees {pynvml.nvmlDeviceGetCount()} device(s)"
    except pynvml.NVMLError as exc:
        return False, f"NVML started but cannot count devices: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


@dataclass
class NvmlView:
    """An initialised NVML and the handle of one device (``handle`` None: figures are unknown)."""

    nvml: Any = None
    handle: Any = None
    reason: str | None = None

    def process_bytes(self, pid: int | None = None) -> int | None:
        return self._read(process_memory, os.getpid() if pid is None else pid)

    def others_bytes(self, pid: int | None = None) -> int | None:
        return self._read(others_memory, os.getpid() if pid is None else pid)

    def device_used_bytes(self) -> int | None:
        if self.handle is None:
            return None
        try:
            return int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)
        except _errors(self.nvml):
            return None

    def _read(self, fn: Any, pid: int) -> int | None:
        if self.handle is None:
            return None
        try:
            result: int | None = fn(self.nvml, self.handle, pid)
            return result
        except _errors(self.nvml):
            return None


@contextmanager
def open_nvml(torch_uuid: str | None, pci_bus_id: str | None) -> Iterator[NvmlView]:
    """Initialise pynvml for one device and shut it down after; never raises for a missing NVML."""
    ok, reason = nvml_available()
    if not ok:
        yield NvmlView(reason=reason)
        return
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pick_nvml_handle(pynvml, torch_uuid, pci_bus_id)
        why = None if handle is not None else "NVML has no device with this UUID or PCI bus id"
        yield NvmlView(pynvml, handle, why)
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


# --- runtime (torch), thin ------------------------------------------------------------------------


def _ids(device_index: int) -> tuple[str | None, str | None]:
    """torch's UUID and PCI bus id of a device (None where this torch does not expose them)."""
    import torch

    props = torch.cuda.get_device_properties(device_index)
    uuid = getattr(props, "uuid", None)
    bus = getattr(props, "pci_bus_id", None)
    pci = None
    if isinstance(bus, int):
        pci = format_pci_bus_id(
            int(getattr(props, "pci_domain_id", 0)), bus, int(getattr(props, "pci_device_id", 0))
        )
    return (str(uuid) if uuid else None), pci


def snapshot(device_index: int) -> CudaSnapshot:
    """Read the device now (initialises CUDA in this process; see the module docstring)."""
    import torch

    free, total = torch.cuda.mem_get_info(device_index)
    reserved = int(torch.cuda.memory_reserved(device_index))
    uuid, pci = _ids(device_index)
    notes: list[str] = []
    with open_nvml(uuid, pci) as nv:
        proc, others, dev_used = nv.process_bytes(), nv.others_bytes(), nv.device_used_bytes()
        if nv.reason:
            notes.append(nv.reason)
        elif proc is None:
            notes.append("NVML cannot see this PID (a container?): the CUDA context is estimated")
    context, source = estimate_context(proc, reserved)
    return CudaSnapshot(
        device_index=device_index,
        name=torch.cuda.get_device_name(device_index),
        total_bytes=int(total),
        free_bytes=int(free),
        torch_reserved_bytes=reserved,
        nvml_used_by_others_bytes=others,
        nvml_device_used_bytes=dev_used,
        nvml_process_bytes=proc,
        context_bytes=context,
        context_source=source,
        uuid=uuid,
        pci_bus_id=pci,
        notes=tuple(notes),
    )


def snapshot_dict(device_index: int) -> dict[str, Any]:
    """:func:`snapshot` as JSON-able data (for the probe protocol)."""
    return snapshot(device_index).to_dict()


def apply_budget_bytes(budget_bytes: int, device_index: int) -> float:
    """Cap this process's reserved memory on the device at ``budget_bytes``; returns the fraction.

    PyTorch multiplies the fraction by the device total (``cudaMemGetInfo`` in older releases,
    ``totalGlobalMem`` in newer); dividing by the larger of the two keeps the cap at or below budget.
    """
    import torch

    _, mem_total = torch.cuda.mem_get_info(device_index)
    props_total = int(torch.cuda.get_device_properties(device_index).total_memory)
    fraction = fraction_for(budget_bytes, max(int(mem_total), props_total))
    torch.cuda.set_per_process_memory_fraction(fraction, device_index)
    return fraction


def apply_budget(budget: Budget, device_index: int) -> float:
    """Enforce a :class:`Budget` in this process (see :func:`apply_budget_bytes`)."""
    return apply_budget_bytes(budget.budget_bytes, device_index)


def reset_peaks(device_index: int) -> None:
    """Start peak figures and the retry/OOM counters from zero for this probe."""
    import torch

    torch.cuda.reset_peak_memory_stats(device_index)
    torch.cuda.reset_accumulated_memory_stats(device_index)


def read_step_stats(device_index: int, nvml: NvmlView | None = None) -> CudaStepStats:
    """Allocator peaks and counters, and this process's NVML figure (opened here when not given)."""
    import torch

    stats = torch.cuda.memory_stats(device_index)
    if nvml is not None:
        process = nvml.process_bytes()
    else:
        with open_nvml(*_ids(device_index)) as view:
            process = view.process_bytes()
    return CudaStepStats(
        max_allocated=int(torch.cuda.max_memory_allocated(device_index)),
        max_reserved=int(torch.cuda.max_memory_reserved(device_index)),
        num_alloc_retries=int(stats.get("num_alloc_retries", 0)),
        num_ooms=int(stats.get("num_ooms", 0)),
        nvml_process_bytes=process,
    )


def synchronize(device_index: int | None = None) -> None:
    """Wait for the device's queued work (timing and peaks are read after this)."""
    import torch

    torch.cuda.synchronize(device_index)


def precision_support(name: str, major: int, minor: int, bf16_native: bool) -> dict[str, str | None]:
    """Precision -> why it cannot run on this GPU (None: it can). bf16 must be native (8.0+)."""
    bf16 = None
    if not bf16_native:
        bf16 = (
            f"bf16 is not native on {name} (compute capability {major}.{minor}; needs 8.0+): "
            "PyTorch would emulate it, slowly"
        )
    return {"32-true": None, "16-mixed": None, "bf16-mixed": bf16, "bf16-true": bf16}


def capabilities(device_index: int) -> dict[str, str | None]:
    """:func:`precision_support` for a real device (torch.cuda.is_bf16_supported without emulation)."""
    import torch

    props = torch.cuda.get_device_properties(device_index)
    with torch.cuda.device(device_index):
        try:
            native = bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # torch without the keyword: decide by compute capability
            native = props.major >= 8
    return precision_support(props.name, props.major, props.minor, native)
