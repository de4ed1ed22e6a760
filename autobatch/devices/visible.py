"""Which GPUs a CUDA process sees, and as which index: ``CUDA_VISIBLE_DEVICES`` read as CUDA reads it.

Pure: the GPUs come in as :class:`Physical` records (from NVML, see :mod:`.inventory`), the variable as a
string; :func:`visible_indices` applies CUDA's rules (indices, GPU UUIDs or their unique prefixes, ``MIG-``
UUIDs or, as drivers before R470 named MIG instances, ``MIG-GPU-<uuid>/<gi>/<ci>``; the list of the first
entry's kind, stopping at the first entry that matches nothing or is of another kind; a device named twice
leaves none visible; a UUID matched as written, case and all) in PCI bus order, which the probe server is
started with (:data:`PROBE_ENV`, ``CUDA_DEVICE_ORDER=PCI_BUS_ID``). The rules are those PyTorch counts devices by without
starting CUDA (``torch.cuda._parse_visible_devices``, ``_transform_uuid_to_ordinals``), so this module and
``torch.cuda.device_count()`` agree. docs/commands.md (``devices``) says what a user sees.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: Environment of the probe server: number CUDA devices in PCI bus order, as this module does.
PROBE_ENV: dict[str, str] = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


@dataclass(frozen=True)
class MigInstance:
    """A MIG instance as NVML lists it: its UUID (``MIG-...``) and its GPU and compute instance ids (None: NVML
    did not say), which the older form of ``CUDA_VISIBLE_DEVICES`` names it by."""

    uuid: str
    gpu_instance: int | None = None
    compute_instance: int | None = None


@dataclass(frozen=True)
class Physical:
    """A physical GPU as NVML lists it: UUID (``GPU-...``), PCI bus id, and its MIG instances."""

    uuid: str
    pci_bus_id: str = ""
    mig: tuple[MigInstance, ...] = field(default_factory=tuple)


def cuda_order(gpus: Sequence[Physical]) -> list[Physical]:
    """The GPUs in CUDA's PCI bus order."""
    return sorted(gpus, key=lambda g: (g.pci_bus_id.upper(), g.uuid))


def visible_indices(gpus: Sequence[Physical], cuda_visible_devices: str | None) -> dict[str, int]:
    """UUID (a GPU's, or a MIG instance's) -> the index a CUDA process started with this variable sees.

    Unset: every GPU, in order; set but empty: none. Otherwise a comma-separated list whose first entry decides
    its kind: indices (into PCI bus order; like ``strtoul``, ``1gpu2`` is 1), GPU UUIDs or unique prefixes of
    them (``GPU-8f0c``), or MIG instances: their ``MIG-`` UUIDs, or their GPU's full UUID with their GPU and
    compute instance ids (``MIG-GPU-8f0c.../1/0``, the form before driver R470; torch parses both as ``MIG-``
    entries, one kind). The visible devices are the listed ones in the listed
    order; the list stops at the first entry of another kind or that matches nothing (an index past the last
    GPU, a negative one, an unknown or ambiguous prefix), and a device named twice leaves none visible. A
    MIG-enabled GPU reached by index or GPU UUID keeps its index here, but which of its instances CUDA opens is
    the driver's choice."""
    ordered = cuda_order(gpus)
    if cuda_visible_devices is None:
        return {gpu.uuid: index for index, gpu in enumerate(ordered)}
    entries = _entries(cuda_visible_devices)
    seen: dict[str, int] = {}
    for entry in entries:
        uuid = _match(entry, ordered)
        if uuid is None:
            break
        if uuid in seen:  # two entries that name one device (a prefix and the full UUID): none is visible
            return {}
        seen[uuid] = len(seen)
    return seen


def _entries(variable: str) -> list[str | int]:
    """The variable's entries of its first entry's kind (an index as an int, a UUID as given), up to the first of
    another kind or a negative index; none when one repeats. As torch reads them: a UUID list is one whose text
    starts with ``GPU-`` or ``MIG-`` as written (upper case, no space before), its entries taken as written (an
    entry with a space before it is of another kind); an index is read from its entry less the spaces around it."""
    kind = next((p for p in ("GPU-", "MIG-") if variable.startswith(p)), None)
    entries: list[str | int] = []
    for token in variable.split(","):
        entry: str | int
        if kind is not None:
            if not token.startswith(kind):
                break
            entry = token
        else:
            digits = re.match(r"[+-]?\d+", token.strip())
            if digits is None or int(digits.group()) < 0:
                break
            entry = int(digits.group())
        if entry in entries:
            return []
        entries.append(entry)
    return entries


#: A MIG instance in the form of drivers before R470: its GPU's UUID, GPU instance id, compute instance id.
_OLD_MIG = re.compile(r"MIG-(GPU-[^/]+)/(\d+)/(\d+)")


def _match(entry: str | int, ordered: Sequence[Physical]) -> str | None:
    """The UUID an entry names; a UUID or its prefix matches as written, case and all, as torch matches it
    (``_transform_uuid_to_ordinals``: NVML writes them in lower case, so ``GPU-8F0C`` names no GPU)."""
    if isinstance(entry, int):
        return ordered[entry].uuid if entry < len(ordered) else None
    if entry.startswith("GPU-"):
        found = [g.uuid for g in ordered if g.uuid.startswith(entry)]
    elif old := _OLD_MIG.fullmatch(entry):
        gpu, ids = old.group(1), (int(old.group(2)), int(old.group(3)))
        found = [
            m.uuid
            for g in ordered
            if g.uuid == gpu
            for m in g.mig
            if (m.gpu_instance, m.compute_instance) == ids
        ]
    else:
        found = [m.uuid for g in ordered for m in g.mig if m.uuid.startswith(entry)]
    return found[0] if len(found) == 1 else None


def describe_variable(env: Mapping[str, str]) -> str:
    """How the visible set was decided, for humans."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return "CUDA_VISIBLE_DEVICES unset: every GPU is visible"
    if not value.strip():
        return "CUDA_VISIBLE_DEVICES is empty: no GPU is visible"
    return f"CUDA_VISIBLE_DEVICES={value}"
