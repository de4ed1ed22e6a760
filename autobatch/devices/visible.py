"""Which GPUs a CUDA process sees, and as which index: ``CUDA_VISIBLE_DEVICES`` read as CUDA reads it.

Pure: the GPUs come in as :class:`Physical` records (from NVML, see :mod:`.inventory`), the variable as a
string; :func:`visible_indices` applies CUDA's documented rules (indices, GPU UUIDs or their unique prefixes,
``MIG-`` UUIDs, the list stopping at the first entry that matches nothing) in PCI bus order, which the probe
server is started with (:data:`PROBE_ENV`, ``CUDA_DEVICE_ORDER=PCI_BUS_ID``). docs/commands.md (``devices``)
says what a user sees.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: Environment of the probe server: number CUDA devices in PCI bus order, as this module does.
PROBE_ENV: dict[str, str] = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


@dataclass(frozen=True)
class Physical:
    """A physical GPU as NVML lists it: UUID (``GPU-...``), PCI bus id, and its MIG instances' UUIDs."""

    uuid: str
    pci_bus_id: str = ""
    mig_uuids: tuple[str, ...] = field(default_factory=tuple)


def cuda_order(gpus: Sequence[Physical]) -> list[Physical]:
    """The GPUs in CUDA's PCI bus order."""
    return sorted(gpus, key=lambda g: (g.pci_bus_id.upper(), g.uuid))


def visible_indices(gpus: Sequence[Physical], cuda_visible_devices: str | None) -> dict[str, int]:
    """UUID (a GPU's, or a MIG instance's) -> the index a CUDA process started with this variable sees.

    Unset: every GPU, in order; set but empty: none. Otherwise a comma-separated list of entries, each an
    index (into PCI bus order), a GPU UUID or a unique prefix of one (``GPU-8f0c``), or a MIG instance's
    ``MIG-`` UUID; the visible devices are the listed ones in the listed order, and the list stops at the
    first entry that matches nothing (or repeats one). A MIG-enabled GPU reached by index or GPU UUID keeps
    its index here, but which of its instances CUDA opens is the driver's choice."""
    ordered = cuda_order(gpus)
    if cuda_visible_devices is None:
        return {gpu.uuid: index for index, gpu in enumerate(ordered)}
    seen: dict[str, int] = {}
    for token in (t.strip() for t in cuda_visible_devices.split(",")):
        uuid = _match(token, ordered)
        if uuid is None or uuid in seen:
            break
        seen[uuid] = len(seen)
    return seen


def _match(token: str, ordered: Sequence[Physical]) -> str | None:
    if not token:
        return None
    if token.lstrip("-").isdigit():
        index = int(token)
        return ordered[index].uuid if 0 <= index < len(ordered) else None
    upper = token.upper()
    if upper.startswith("GPU-"):
        found = [g.uuid for g in ordered if g.uuid.upper().startswith(upper)]
    elif upper.startswith("MIG-"):
        found = [m for g in ordered for m in g.mig_uuids if m.upper().startswith(upper)]
    else:
        return None
    return found[0] if len(found) == 1 else None


def describe_variable(env: Mapping[str, str]) -> str:
    """How the visible set was decided, for humans."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return "CUDA_VISIBLE_DEVICES unset: every GPU is visible"
    if not value.strip():
        return "CUDA_VISIBLE_DEVICES is empty: no GPU is visible"
    return f"CUDA_VISIBLE_DEVICES={value}"
