"""The torch.cuda calls of a probe: read the device, cap the allocator, read the step's counters.

Kept thin: the arithmetic is in :mod:`.budget`, the NVML reads in :mod:`.nvml`. Each function imports
torch inside it, so importing this module is cheap. :func:`snapshot` initialises CUDA: call it in a
probe process, never in a process that forks probes afterwards (:func:`fork_breaks_cuda` tells whether
one already did). Written against PyTorch's documented
``torch.cuda`` API; not run on a GPU here (the development machines have none; tests marked ``gpu``
run only where CUDA is available).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from autobatch.devices.cuda.budget import (
    ALLOC_CONF_VARIABLES,
    CudaSnapshot,
    CudaStepStats,
    estimate_context,
    fraction_for,
    precision_support,
)
from autobatch.devices.cuda.nvml import NvmlView, format_pci_bus_id, open_nvml


def device_ids(device_index: int) -> tuple[str | None, str | None]:
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
    uuid, pci = device_ids(device_index)
    notes: list[str] = []
    with open_nvml(uuid, pci) as nv:
        proc, others, dev_used = nv.process_bytes(), nv.others_bytes(), nv.device_used_bytes()
        if nv.reason:
            notes.append(f"the CUDA context is estimated: {nv.reason}")
        elif proc is None:
            notes.append("NVML cannot see this PID (a container?): the CUDA context is estimated")
    context, source = estimate_context(proc, reserved)
    asked = {name: os.environ[name] for name in ALLOC_CONF_VARIABLES if name in os.environ}
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
        allocator_asked=asked,
        allocator_effective=allocator_settings(),
    )


def allocator_settings() -> dict[str, Any]:
    """The CUDA allocator's settings in effect, as this torch reports them: ``backend``
    (``torch.cuda.memory.get_allocator_backend()``: ``native`` or ``cudaMallocAsync``) and, for the native caching
    allocator, ``expandable_segments`` (its parsed setting, as its memory snapshot reports it:
    ``torch.cuda.memory._snapshot()["allocator_settings"]``, the snapshot the memory visualizer reads; torch has no
    public call for it). A setting this torch does not report (an older release, a build without CUDA) is left out.
    Call it after CUDA is initialised."""
    import torch

    found: dict[str, Any] = {}
    try:
        found["backend"] = str(torch.cuda.memory.get_allocator_backend())
    except (AttributeError, RuntimeError):  # a release before 2.0, a build without CUDA
        pass
    if found.get("backend", "native") != "native":  # cudaMallocAsync refuses a snapshot
        return found
    try:
        settings = torch.cuda.memory._snapshot().get("allocator_settings", {})
    except (AttributeError, RuntimeError, TypeError):
        return found
    if "expandable_segments" in settings:
        found["expandable_segments"] = bool(settings["expandable_segments"])
    return found


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


def reset_peaks(device_index: int) -> None:
    """Start peak figures and the retry/OOM counters from zero for this probe."""
    import torch

    torch.cuda.reset_peak_memory_stats(device_index)
    torch.cuda.reset_accumulated_memory_stats(device_index)


def read_step_stats(device_index: int, nvml: NvmlView) -> CudaStepStats:
    """Allocator peaks and counters, and this process's memory on the device as ``nvml`` reads it now.

    NVML reports current usage, not a peak. Read after the steps it still covers them: the caching
    allocator keeps its segments (nothing calls ``empty_cache``), so the process still holds its peak
    reservation unless the allocator had to release it (a retry, which fails the step anyway).
    """
    import torch

    stats = torch.cuda.memory_stats(device_index)
    return CudaStepStats(
        max_allocated=int(torch.cuda.max_memory_allocated(device_index)),
        max_reserved=int(torch.cuda.max_memory_reserved(device_index)),
        num_alloc_retries=int(stats.get("num_alloc_retries", 0)),
        num_ooms=int(stats.get("num_ooms", 0)),
        nvml_process_bytes=nvml.process_bytes(),
    )


def synchronize(device_index: int | None = None) -> None:
    """Wait for the device's queued work (timing and peaks are read after this)."""
    import torch

    torch.cuda.synchronize(device_index)


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


def fork_breaks_cuda() -> str | None:
    """Why a process forked from this one could not use CUDA, as what this process did ("holds a CUDA context";
    None: it could, or torch is not imported here).

    A CUDA context is one reason (``torch.cuda.is_initialized()``). The other leaves no context:
    ``torch.cuda.is_available()`` (unless ``PYTORCH_NVML_BASED_CUDA_CHECK=1``), or ``torch.cuda.device_count()``
    where NVML cannot count, starts CUDA's driver, and torch then marks every process forked afterwards as one
    that must not initialise CUDA ("Cannot re-initialize CUDA in forked subprocess"), while
    ``is_initialized()`` stays False. A library that asks at import (to pick its kernels) does it. Torch shows
    the mark only in the child (``torch.cuda._is_in_bad_fork()``), so a child forked for the question answers
    it and exits at once; a torch built without CUDA has nothing to mark."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if torch.cuda.is_initialized():
        return "holds a CUDA context"
    if not torch.cuda._is_compiled():
        return None
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child answers with its exit status
        os._exit(3 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 3:
        return None
    return (
        "started CUDA's driver (torch.cuda.is_available() without PYTORCH_NVML_BASED_CUDA_CHECK=1, or "
        "torch.cuda.device_count() where NVML cannot count): a process forked from it cannot initialise CUDA"
    )
