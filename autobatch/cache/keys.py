"""What a tune's answer depends on, and the key it is stored under.

:class:`TuneInputs` gathers, before any probe server starts (no torch import), the script's sources and
arguments, the settings that decide memory, the device's identity (the model's, never one card's serial
number, so that nodes of one type share a cache) and the versions: the table in docs/clusters.md. Its
:meth:`~TuneInputs.key` names the stored result; the probe journal's :func:`fingerprint` adds what only a
started session knows (the budget the device leaves).
"""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autobatch.records.version import MEASURED_BY, torch_version

if TYPE_CHECKING:
    from autobatch.settings import Settings
    from autobatch.step.spec import ScriptSpec

#: The settings a tune's result depends on (output paths and timeouts do not change the answer).
KEY_SETTINGS: tuple[str, ...] = (
    "device",  # as asked: a result records it (an "auto" that fell back to the CPU refuses GPU configs)
    "memory",
    "headroom",
    "precisions",
    "optimizers",
    "recompute",
    "recompute_classes",
    "batch_multiple",
    "max_batch_size",
    "exact_all",
    "optimizer_kwargs",
    "global_batch_size",
    "objective",
    "steps",
    "max_steps",
    "confirm_steps",
)


def digest(parts: Iterable[Any], length: int = 16) -> str:
    """A short sha256 of JSON-encoded parts (keys sorted)."""
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(json.dumps(part, sort_keys=True, default=str).encode())
        hasher.update(b"\0")
    return hasher.hexdigest()[:length]


def fingerprint(sources: Mapping[str, str], parts: Iterable[Any]) -> str:
    """The probe journal's key: the sources' digests and everything else that decides a probe's outcome."""
    return digest([dict(sources), *parts])


def versions() -> dict[str, str]:
    return {"torch": torch_version(), "autobatch": MEASURED_BY, "python": platform.python_version()}


@dataclass(frozen=True)
class TuneInputs:
    """Everything a stored tune result is valid for; ``cacheable`` False: nothing is stored or served.

    ``why_not`` says why a result cannot be cached (the CPU's capacity is the memory available right
    now unless ``--memory`` fixes it; a CUDA device NVML cannot identify).
    """

    sources: dict[str, str]
    script_args: list[str]
    settings: dict[str, Any]
    device: dict[str, Any]
    versions: dict[str, str]
    why_not: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cacheable(self) -> bool:
        return self.why_not is None

    def key(self) -> str:
        return digest([self.sources, self.script_args, self.settings, self.device, self.versions, self.extra])

    def to_dict(self) -> dict[str, Any]:
        return {
            "sources": self.sources,
            "script_args": self.script_args,
            "settings": self.settings,
            "device": self.device,
            "versions": self.versions,
            **({"extra": self.extra} if self.extra else {}),
        }


def key_settings(settings: Settings, world_size: int) -> dict[str, Any]:
    """The settings that decide a tune's result, as plain values (the world size resolved)."""
    from autobatch.settings.values import plain

    values = {name: plain(settings.get(name)) for name in KEY_SETTINGS}
    values["world_size"] = world_size
    if settings.distributed.strategy != "none":  # each rank's memory; single-process keys stay as they were
        values["strategy"] = [settings.distributed.strategy, settings.distributed.nproc_per_node]
    if settings.search.strict:  # a strict tune fails where another warns: never served the other's answer
        values["strict"] = True
    if (
        settings.search.seq_lens or settings.plan.seq_len
    ):  # lengths searched; one-shape keys stay as they were
        values["seq_lens"] = [list(settings.search.seq_lens), settings.plan.seq_len]
    if settings.script.batch_env:  # how the batch reaches a script run as it is
        values["batch_env"] = settings.script.batch_env
    if settings.script.seq_len_env:  # how the length reaches it
        values["seq_len_env"] = settings.script.seq_len_env
    return values


def tune_inputs(
    settings: Settings,
    device_identity: Mapping[str, Any],
    world_size: int,
    *,
    spec: ScriptSpec | None = None,
    why_not: str | None = None,
) -> TuneInputs:
    """The inputs of a tune of ``settings`` (its step: ``spec``, else the settings' script) on the device
    ``device_identity`` describes."""
    from autobatch.cache.sources import source_digests
    from autobatch.step.spec import spec_from_settings

    spec = spec or spec_from_settings(settings)
    sources = (
        source_digests(spec.target)
        if spec.is_file
        else {"spec": hashlib.sha256(spec.content()).hexdigest()}  # an HF config, a module, a pickle
    )
    return TuneInputs(
        sources=sources,
        script_args=list(settings.script.script_args),
        settings=key_settings(settings, world_size),
        device=dict(device_identity),
        versions=versions(),
        why_not=why_not,
    )
