"""The devices a tune runs on, each with its identity (for the cache) and its lock key (one tuner at a time).

Read before any probe server starts, from the inventory (NVML, no torch): :func:`targets_for` turns the
``device`` setting into targets: ``cpu`` the host, ``cuda:N`` the N-th visible device, ``cuda`` or ``auto``
one per distinct GPU model (:mod:`autobatch.run.across_models` plans across them; ``auto`` is the CPU without
a visible GPU or a driver). The identity is the model's, not the card's, so a shared cache serves every node
of one type (docs/clusters.md).
"""

from __future__ import annotations

import os
import platform
import socket
from dataclasses import dataclass, field
from typing import Any

from autobatch.devices.cpu import cores, environment
from autobatch.devices.inventory import Gpu, Inventory, cpu_model
from autobatch.settings.levers import neutral

#: The environment what a CUDA process's caching allocator reserves depends on (expandable segments, split sizes,
#: garbage collection; caching at all): a tune under one setting says nothing of a job under another.
CUDA_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING")

CPU_NOT_CACHED = (
    f"on the CPU without {neutral('memory')} the capacity is the memory available when the tune starts, which "
    f"changes from run to run: give {neutral('memory')} to keep the result"
)


@dataclass(frozen=True)
class Target:
    """One device to tune on."""

    device: str  # "cpu", "cuda:N", or the request as given when NVML cannot list the GPUs
    label: str  # for humans: "cuda:0 (NVIDIA A100-SXM4-80GB, GPU-8f0c...)"
    lock_key: str
    identity: dict[str, Any]
    model: str = "cpu"
    indices: tuple[int, ...] = ()  # every visible index of this model
    used_bytes: int | None = None  # memory in use on the device now (NVML), None on the CPU
    not_cached: str | None = None  # why a result on this target is not stored
    notes: tuple[str, ...] = field(default_factory=tuple)


def resolve_targets(device: str, memory: int | None, inventory: Inventory | None = None) -> list[Target]:
    """:func:`targets_for` on this machine; the CPU device needs no inventory (NVML is not read)."""
    if device == "cpu":
        return [cpu_target(memory, inventory)]
    from autobatch.devices.inventory import read_inventory

    return targets_for(device, memory, inventory or read_inventory())


def targets_for(device: str, memory: int | None, inventory: Inventory) -> list[Target]:
    """The targets of a ``device`` setting on this machine.

    * ``cpu``: the host; its lock is the host's, its identity the processor, architecture and C library.
    * ``cuda:N``: the N-th visible GPU (or MIG instance), locked by its UUID.
    * ``cuda`` or ``auto`` with visible GPUs: one target per distinct GPU model (name, memory, MIG profile),
      each the first visible device of its model. ``auto`` is the CPU when no GPU is visible or there is no
      NVIDIA driver (NVML cannot start, so CUDA cannot either).
    * Without pynvml, or for a GPU NVML does not list, a CUDA request stays as given: the session resolves
      it, the lock is keyed by host and index, and the result is not cached (nothing identifies the card).

    An identity holds the model's name, total memory, MIG profile, driver and CUDA driver versions, and the
    allocator's variables (:data:`CUDA_ENV`) where any is set.
    """
    visible = inventory.visible()
    if device == "cpu" or (device == "auto" and not visible and inventory.nvml != "missing"):
        return [cpu_target(memory, inventory)]  # no driver, or no visible GPU: CUDA cannot run either
    if not visible:
        # without pynvml, the probe's note on the CUDA context names the import error and the fix: said once there
        why = "no pynvml" if inventory.nvml == "missing" else inventory.no_gpu
        return [_unidentified(device, why)]
    if device in ("auto", "cuda"):
        return _one_per_model(visible, inventory)
    index = int(device.partition(":")[2] or 0)
    for gpu in visible:
        if gpu.index == index:
            same = tuple(g.index for g in visible if _model(g) == _model(gpu) and g.index is not None)
            return [gpu_target(gpu, inventory, same)]
    return [_unidentified(device, f"no visible GPU has index {index} ({inventory.visibility})")]


def cpu_target(memory: int | None, inventory: Inventory | None = None) -> Target:
    host = inventory.host.hostname if inventory is not None else socket.gethostname()
    identity = {
        "type": "cpu",
        "machine": platform.machine(),
        "processor": cpu_model(),
        "libc": " ".join(platform.libc_ver()).strip(),
        # what a process's memory depends on beyond the script: its threads (one per core it may run on, unless
        # OMP_NUM_THREADS says otherwise), its allocator's settings
        "cores": cores(),
        "environment": environment(),
    }
    return Target(
        device="cpu",
        label=f"cpu ({host})",
        lock_key=f"host-{host}",
        identity=identity,
        not_cached=None if memory else CPU_NOT_CACHED,
    )


def gpu_target(gpu: Gpu, inventory: Inventory, indices: tuple[int, ...] = ()) -> Target:
    identity: dict[str, Any] = {
        "type": "cuda",
        "name": gpu.name,
        "total_bytes": gpu.total_bytes,
        "mig_profile": gpu.mig_profile,
        "driver": inventory.driver_version,
        "cuda_driver": inventory.cuda_driver_version,
    }
    if allocator := {name: os.environ[name] for name in CUDA_ENV if name in os.environ}:
        identity["environment"] = (
            allocator  # only when set: the identities of tunes without one stay as they were
        )
    kind = "mig" if gpu.parent_uuid else "gpu"
    return Target(
        device=f"cuda:{gpu.index}",
        label=f"cuda:{gpu.index} ({gpu.name}, {gpu.uuid})",
        lock_key=f"{kind}-{_safe(gpu.uuid)}",
        identity=identity,
        model=_model_label(gpu),
        indices=indices or ((gpu.index,) if gpu.index is not None else ()),
        used_bytes=gpu.used_bytes,
        notes=tuple(gpu.notes),
    )


def _one_per_model(visible: list[Gpu], inventory: Inventory) -> list[Target]:
    groups: dict[tuple[Any, ...], list[Gpu]] = {}
    for gpu in visible:
        groups.setdefault(_model(gpu), []).append(gpu)
    return [
        gpu_target(gpus[0], inventory, tuple(g.index for g in gpus if g.index is not None))
        for gpus in groups.values()
    ]


def _unidentified(device: str, why: str | None) -> Target:
    host = socket.gethostname()
    return Target(
        device=device,
        label=f"{device} ({host})",
        lock_key=f"{device.replace(':', '-')}-host-{host}",
        identity={"type": "cuda", "device": device, "unidentified": True},
        model=device,
        not_cached=f"NVML cannot identify the GPU ({why}): a result is kept only for a known card",
    )


def _model(gpu: Gpu) -> tuple[Any, ...]:
    return (gpu.name, gpu.total_bytes, gpu.mig_profile)


def _model_label(gpu: Gpu) -> str:
    from autobatch.core.units import format_bytes

    size = format_bytes(gpu.total_bytes) if gpu.total_bytes else "unknown memory"
    return f"{gpu.name} ({size})"


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)
