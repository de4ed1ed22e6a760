"""What this machine offers: every GPU NVML lists (with the index this process sees it as), who holds
memory on each, MIG instances, and the host's memory. ``autobatch devices`` prints it; ``tune`` picks
its devices, their identities and their locks from it (:mod:`.targets`).

Read without torch and without a CUDA context (so it is quick and never disturbs the GPUs), through
nvidia-ml-py's documented functions; ``pynvml.NVMLError`` means "unknown", never a failure. The pynvml
module is an argument, so tests pass a fake (``tests/fake_nvml.py``). Process PIDs are the host's:
inside a container NVML may list PIDs that do not exist here, so a process's name is looked up only
when its PID is in this PID namespace, and memory the listed processes do not account for is shown
as held by processes NVML does not list.
"""

from __future__ import annotations

import copy
import importlib
import os
import platform
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from autobatch.devices.cgroup import jobs_own
from autobatch.devices.cuda.nvml import NVML_DEVICE_MIG_ENABLE, _errors, device_memory, running_processes
from autobatch.devices.visible import MigInstance, Physical, describe_variable, visible_indices


@dataclass
class GpuProcess:
    pid: int
    used_bytes: int | None  # None: NVML cannot tell (MIG, some drivers)
    name: str | None = None  # None: the PID is not in this PID namespace (a container?)


@dataclass
class Gpu:
    """A physical GPU or a MIG instance (``parent_uuid`` set)."""

    nvml_index: int
    name: str
    uuid: str
    index: int | None = None  # as CUDA (torch) sees it here under CUDA_VISIBLE_DEVICES; None: not visible
    pci_bus_id: str | None = None
    total_bytes: int | None = None
    used_bytes: int | None = None  # allocated by processes (NVML v2); with the driver's reservation under v1
    free_bytes: int | None = None
    reserved_bytes: int | None = None  # the driver's and firmware's (None: this driver reports v1 only)
    processes: list[GpuProcess] = field(default_factory=list)
    unlisted_bytes: int | None = None  # used memory no listed process accounts for (v1: reservation in it)
    mig_enabled: bool = False
    mig: list[Gpu] = field(default_factory=list)
    parent_uuid: str | None = None
    # a MIG instance's GPU and compute instance ids (None: not an instance, or NVML cannot tell)
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def mig_profile(self) -> str | None:
        """``1g.10gb`` from a MIG instance's name (``NVIDIA A100-SXM4-80GB MIG 1g.10gb``)."""
        if self.parent_uuid is None:
            return None
        _, _, profile = self.name.rpartition(" MIG ")
        return profile or self.name


@dataclass
class HostMemory:
    hostname: str
    total_bytes: int
    available_bytes: int
    used_bytes: int
    cgroup_limit_bytes: int | None = None  # the memory limit of the job's cgroup (a SLURM job's --mem)


@dataclass
class NvmlFacts:
    """What NVML says of the machine's GPUs, before a process's view of them (its indices under
    ``CUDA_VISIBLE_DEVICES``) is put on it: what :class:`NvmlReader` reads, and what the daemon serves its
    commands (:meth:`to_dict`, :meth:`from_dict`)."""

    gpus: list[Gpu] = field(default_factory=list)
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    no_gpu: str | None = None  # why no GPU is listed (no driver, no pynvml, ...)
    nvml: str = "ok"  # "ok", "no-driver" (NVML cannot start: no CUDA either), "missing" (no pynvml: unknown)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NvmlFacts:
        return cls(**{**data, "gpus": [_gpu_from(g) for g in data.get("gpus", ())]})


def _gpu_from(data: Mapping[str, Any]) -> Gpu:
    processes = [GpuProcess(**p) for p in data.get("processes", ())]
    return Gpu(**{**data, "processes": processes, "mig": [_gpu_from(m) for m in data.get("mig", ())]})


@dataclass
class Inventory:
    host: HostMemory
    gpus: list[Gpu] = field(default_factory=list)
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    no_gpu: str | None = None  # why no GPU is listed (no driver, no pynvml, ...)
    nvml: str = "ok"  # "ok", "no-driver" (NVML cannot start: no CUDA either), "missing" (no pynvml: unknown)
    visibility: str = ""
    notes: list[str] = field(default_factory=list)

    @classmethod
    def seen(cls, facts: NvmlFacts, env: Mapping[str, str]) -> Inventory:
        """The machine as a process with environment ``env`` sees it: NVML's ``facts``, this host's memory, and
        each GPU's index under ``CUDA_VISIBLE_DEVICES``."""
        own = copy.deepcopy(facts)  # the reader's facts stay its own
        nvml = {f.name: getattr(own, f.name) for f in fields(NvmlFacts)}
        inventory = cls(host=host_memory(), visibility=describe_variable(env), **nvml)
        if inventory.gpus:
            _place(inventory, env)
        return inventory

    def visible(self) -> list[Gpu]:
        """GPUs and MIG instances this process sees, by index."""
        every = [g for gpu in self.gpus for g in (gpu, *gpu.mig)]
        return sorted((g for g in every if g.index is not None), key=lambda g: g.index or 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Where a command run by the daemon gets NVML's facts: the daemon's reader, open for its life
#: (:func:`served_by`); None: this process reads NVML itself.
_served: Callable[[], NvmlFacts] | None = None


def served_by(source: Callable[[], NvmlFacts] | None) -> None:
    """Read NVML's facts from ``source`` (the daemon's, for a command it runs) rather than in this process; a
    source that fails is passed over for a read of this process's own."""
    global _served
    _served = source


def read_inventory(nvml: Any = None, env: Mapping[str, str] | None = None) -> Inventory:
    """The inventory now (``nvml``: the pynvml module, imported when None), NVML opened for this read alone; in a
    command the daemon runs, from the daemon's reader (:func:`served_by`)."""
    env = os.environ if env is None else env
    facts = None
    if nvml is None and _served is not None:
        try:
            facts = _served()
        except Exception:  # noqa: BLE001 - the daemon went away: this process reads NVML itself
            facts = None
    if facts is None:
        reader = NvmlReader(nvml)
        try:
            facts = reader.read()
        finally:
            reader.close()
    return Inventory.seen(facts, env)


@dataclass
class _Fixed:
    """A GPU's facts that stay while NVML is open and the GPU is not reconfigured, and its handle."""

    handle: Any
    gpu: Gpu  # name, UUID, PCI bus, MIG mode; no memory, processes or instances


class NvmlReader:
    """NVML opened once: the GPUs' fixed facts (driver, names, UUIDs, PCI buses, MIG modes) read at the first
    call and again only when they change (another device count or MIG mode); what moves (memory, processes, MIG
    instances) read at every call. An NVML call that fails the whole read (a GPU lost, the driver reloaded)
    starts NVML again, once. :func:`read_inventory` opens one for a single read; the daemon keeps one (let go when
    idle: :meth:`close_if_idle`), so its commands never start NVML themselves. Thread-safe (one read at a time)."""

    def __init__(self, nvml: Any = None) -> None:
        self._given = nvml
        self._nvml: Any = None  # the module, while NVML is started
        self._fixed: list[_Fixed] = []
        self._count = -1  # NVML's device count when the fixed facts were read
        self._base = NvmlFacts()  # the driver's versions and the fixed read's notes
        self._lock = threading.Lock()
        self._last = time.monotonic()  # the last read
        #: NVML started, fixed facts read, reads served: what ``autobatch daemon status`` shows.
        self.counts = {"starts": 0, "fixed_reads": 0, "reads": 0}

    def read(self) -> NvmlFacts:
        with self._lock:
            self.counts["reads"] += 1
            self._last = time.monotonic()
            for attempt in (1, 2):
                facts = self._start()
                if facts is not None:  # NVML cannot start (or pynvml is missing): said why
                    return facts
                try:
                    return self._read()
                except _errors(self._nvml) as exc:
                    self._stop()
                    if attempt == 2:
                        return NvmlFacts(no_gpu=f"NVML started but cannot list the GPUs ({exc})")
            raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            self._stop()

    def close_if_idle(self, seconds: float) -> None:
        """Let NVML go when nothing read it for ``seconds`` (the next read starts it again)."""
        with self._lock:
            if self._nvml is not None and time.monotonic() - self._last > seconds:
                self._stop()

    def _start(self) -> NvmlFacts | None:
        """NVML started (None), or the facts of why it cannot be."""
        if self._nvml is not None:
            return None
        nvml = self._given
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError as exc:
                return NvmlFacts(
                    no_gpu=f"pynvml is not importable ({exc}): pip install nvidia-ml-py", nvml="missing"
                )
        try:
            nvml.nvmlInit()
        except (*_errors(nvml), OSError) as exc:  # type: ignore[misc]
            return NvmlFacts(no_gpu=f"no NVIDIA driver: NVML cannot start ({exc})", nvml="no-driver")
        self._nvml, self._count = nvml, -1
        self.counts["starts"] += 1
        return None

    def _stop(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except _errors(self._nvml):
                pass
        self._nvml, self._fixed, self._count = None, [], -1

    def _read(self) -> NvmlFacts:
        nvml = self._nvml
        count = nvml.nvmlDeviceGetCount()
        if count != self._count or any(
            _mig_enabled(nvml, f.handle) != f.gpu.mig_enabled for f in self._fixed
        ):
            self._read_fixed(nvml, count)
        facts = copy.deepcopy(self._base)
        for fixed in self._fixed:
            gpu = copy.deepcopy(fixed.gpu)
            _usage(nvml, fixed.handle, gpu)
            if gpu.mig_enabled:
                gpu.mig = _instances(nvml, fixed.handle, gpu.nvml_index, gpu.uuid)
            facts.gpus.append(gpu)
        if not facts.gpus:
            facts.no_gpu = "NVML lists no GPU on this machine"
        return facts

    def _read_fixed(self, nvml: Any, count: int) -> None:
        self.counts["fixed_reads"] += 1
        cuda = _call(nvml, "nvmlSystemGetCudaDriverVersion")
        self._base = NvmlFacts(
            driver_version=_text(_call(nvml, "nvmlSystemGetDriverVersion")),
            cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
        )
        self._fixed, self._count = [], count
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except _errors(nvml) as exc:
                self._base.notes.append(f"NVML device {index} cannot be read ({exc})")
                continue
            gpu = _identity(nvml, handle, index)
            gpu.mig_enabled = _mig_enabled(nvml, handle)
            self._fixed.append(_Fixed(handle, gpu))


def _place(inventory: Inventory, env: Mapping[str, str]) -> None:
    """Each GPU's index as this process sees it, and what the reader should know of that view."""
    physical = [
        Physical(
            g.uuid,
            g.pci_bus_id or "",
            tuple(MigInstance(m.uuid, m.gpu_instance_id, m.compute_instance_id) for m in g.mig),
        )
        for g in inventory.gpus
    ]
    indices = visible_indices(physical, env.get("CUDA_VISIBLE_DEVICES"))
    for gpu in inventory.gpus:
        gpu.index = indices.get(gpu.uuid)
        for instance in gpu.mig:
            instance.index = indices.get(instance.uuid)
        if gpu.mig_enabled and gpu.index is not None:
            gpu.notes.append(
                "MIG is enabled: which instance CUDA opens through this GPU is the driver's choice; "
                "name one with CUDA_VISIBLE_DEVICES=MIG-<uuid>"
            )
    models = {(g.name, g.total_bytes) for g in inventory.visible()}
    if len(models) > 1 and env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        inventory.notes.append(
            "indices follow PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID, as autobatch's probes use); CUDA's "
            "default order (FASTEST_FIRST) may number these different models otherwise"
        )
    if not inventory.visible():
        inventory.no_gpu = (
            f"NVML lists {len(inventory.gpus)} GPU(s), none visible here ({inventory.visibility})"
        )


def _identity(nvml: Any, handle: Any, nvml_index: int, parent: str | None = None) -> Gpu:
    """A GPU's (or MIG instance's) name, UUID and, for a GPU, PCI bus."""
    gpu = Gpu(
        nvml_index=nvml_index,
        name=_text(_call(nvml, "nvmlDeviceGetName", handle)) or "unknown GPU",
        uuid=_text(_call(nvml, "nvmlDeviceGetUUID", handle)) or f"unknown-{nvml_index}",
        parent_uuid=parent,
    )
    if parent is None:
        pci = _call(nvml, "nvmlDeviceGetPciInfo", handle)
        gpu.pci_bus_id = _text(getattr(pci, "busId", None)) if pci is not None else None
    return gpu


def _mig_enabled(nvml: Any, handle: Any) -> bool:
    mode = _call(nvml, "nvmlDeviceGetMigMode", handle)
    return bool(mode) and mode[0] == NVML_DEVICE_MIG_ENABLE


def _usage(nvml: Any, handle: Any, gpu: Gpu) -> Gpu:
    """``gpu`` with its memory and processes now; its used memory on CUDA's footing where the driver reports it
    apart from the driver's reservation (:func:`~autobatch.devices.cuda.nvml.device_memory`), as a tune counts it."""
    try:
        memory = device_memory(nvml, handle)
    except _errors(nvml):
        memory = None
    if memory is not None:
        gpu.total_bytes, gpu.used_bytes, gpu.free_bytes = memory.total, memory.used, memory.free
        gpu.reserved_bytes = memory.reserved
    _processes(nvml, handle, gpu)
    return gpu


def _instances(nvml: Any, handle: Any, nvml_index: int, parent: str) -> list[Gpu]:
    slots = _call(nvml, "nvmlDeviceGetMaxMigDeviceCount", handle) or 0
    found = []
    for slot in range(int(slots)):
        instance = _call(nvml, "nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
        if instance is not None:
            mig = _identity(nvml, instance, nvml_index, parent=parent)
            mig.gpu_instance_id = _call(nvml, "nvmlDeviceGetGpuInstanceId", instance)
            mig.compute_instance_id = _call(nvml, "nvmlDeviceGetComputeInstanceId", instance)
            found.append(_usage(nvml, instance, mig))
    return found


def _processes(nvml: Any, handle: Any, gpu: Gpu) -> None:
    try:
        usage = running_processes(nvml, handle)
    except _errors(nvml) as exc:
        gpu.notes.append(f"NVML cannot list the processes ({exc})")
        return
    gpu.processes = [GpuProcess(pid, used, _process_name(pid)) for pid, used in sorted(usage.items())]
    listed = sum(p.used_bytes or 0 for p in gpu.processes)
    if gpu.used_bytes is not None and all(p.used_bytes is not None for p in gpu.processes):
        gpu.unlisted_bytes = max(0, gpu.used_bytes - listed)
    if any(p.name is None for p in gpu.processes):
        gpu.notes.append(
            "some PIDs are not in this PID namespace (a container?): NVML reports the host's PIDs"
        )


def _process_name(pid: int) -> str | None:
    import psutil

    try:
        return str(psutil.Process(pid).name())
    except (psutil.Error, OSError):
        return None


def _call(nvml: Any, name: str, *args: Any) -> Any:
    fn = getattr(nvml, name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except _errors(nvml):
        return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def node_type(inventory: Inventory) -> str:
    """A file-name-safe name of what this node offers: ``4x-nvidia-a100-sxm4-80gb`` (models joined by
    ``+``), or ``cpu-<processor>`` without a visible GPU; job scripts keep one calibration per node type."""
    from collections import Counter

    visible = inventory.visible()
    if visible:
        models = Counter(g.name for g in visible)
        text = "+".join(f"{count}x-{name}" for name, count in models.items())
    else:
        text = f"cpu-{cpu_model()}"
    slug = "".join(c if c.isalnum() or c in "+." else "-" for c in text.lower())
    return "-".join(part for part in slug.split("-") if part)


def host_memory() -> HostMemory:
    """The host's memory (psutil) and the limit of the job's memory cgroup, if any: this process's, or the client's
    for a command the daemon runs (:func:`autobatch.devices.cgroup.jobs_own`), never the daemon's."""
    import psutil

    vm = psutil.virtual_memory()
    return HostMemory(
        hostname=socket.gethostname(),
        total_bytes=int(vm.total),
        available_bytes=int(vm.available),
        used_bytes=int(vm.total - vm.available),
        cgroup_limit_bytes=cgroup.limit_bytes if (cgroup := jobs_own()) is not None else None,
    )


def cpu_model() -> str:
    """The processor's model name (/proc/cpuinfo), else platform's."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
