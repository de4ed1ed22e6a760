"""NVML (pynvml, from nvidia-ml-py): which NVML device is torch's, and who uses how much memory on it.

NVML sees what PyTorch's allocator cannot: the CUDA context, memory allocated outside PyTorch (NCCL, cuBLAS
handles) and other processes. Devices are matched to torch's by UUID, then PCI bus id, never by index
(:func:`pick_nvml_handle`). Through :func:`open_nvml` and :class:`NvmlView` a missing driver, library or
permission, or our PID hidden by a container, gives unknown figures (None), never an exception. The functions
take the pynvml module as an argument, so tests pass a fake; only :func:`nvml_available` and
:func:`open_nvml` import pynvml.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

#: nvmlDeviceGetMigMode's "enabled".
NVML_DEVICE_MIG_ENABLE = 1


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
    """The exceptions NVML calls raise: ``NVMLError`` and ``NVMLLibraryMismatchError`` (not a subclass)."""
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


@dataclass(frozen=True)
class DeviceMemory:
    """A device's memory as NVML reports it (bytes). ``used`` is what processes allocated; ``reserved`` the memory
    the driver and firmware set aside, which CUDA's total (``cudaMemGetInfo``) already leaves out, so ``used`` is on
    CUDA's footing. ``reserved`` None: the driver reports only version 1, whose ``used`` includes the reservation."""

    total: int
    used: int
    free: int
    reserved: int | None


def device_memory(nvml: Any, handle: Any) -> DeviceMemory:
    """The device's memory, version 2 of ``nvmlDeviceGetMemoryInfo`` where the driver and nvidia-ml-py have it
    (``reserved`` apart from ``used``), else version 1 (``used`` with the reservation in it): the one reader of a
    device's used memory. Raises NVML's errors."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    # a driver without nvmlDeviceGetMemoryInfo_v2 (NVML's FunctionNotFound), a pynvml without the keyword
    no_v2: tuple[type[BaseException], ...] = (*_errors(nvml), TypeError, AttributeError)
    if version is not None:
        try:
            info = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            return DeviceMemory(int(info.total), int(info.used), int(info.free), int(info.reserved))
        except no_v2:
            pass
    info = nvml.nvmlDeviceGetMemoryInfo(handle)
    return DeviceMemory(int(info.total), int(info.used), int(info.free), None)


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


def job_memory(nvml: Any, pids: Collection[int]) -> int | None:
    """The device memory a job's processes hold on its busiest device: per device, the sum of what NVML lists
    for ``pids`` (each process's CUDA context included); the largest of those sums. None when NVML lists none
    of them with a figure."""
    wanted, largest = set(pids), None
    for handle in _device_handles(nvml):
        try:
            usage = running_processes(nvml, handle)
        except _errors(nvml):
            continue
        held = [used for pid, used in usage.items() if pid in wanted and used is not None]
        if held:
            largest = max(largest or 0, sum(held))
    return largest


class JobMeter:
    """NVML opened once for a supervised job (``autobatch run``): :meth:`read` gives :func:`job_memory` of its
    processes, None when NVML is unavailable or lists none of them; :meth:`close` shuts NVML down."""

    def __init__(self, nvml: Any = None) -> None:
        self.nvml = nvml
        if nvml is None and nvml_available()[0]:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self._own = True
        else:
            self._own = False

    def read(self, pids: Collection[int]) -> int | None:
        if self.nvml is None:
            return None
        try:
            return job_memory(self.nvml, pids)
        except _errors(self.nvml):
            return None

    def close(self) -> None:
        if self._own and self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except _errors(self.nvml):
                pass
            self.nvml = None


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
            return device_memory(self.nvml, self.handle).used
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
