"""Stored tune results: a second identical ``tune`` answers from here without starting a probe server.

:class:`ResultStore` keeps one ``<cache_dir>/<key>.result.json`` per complete result and serves it only
while its inputs, the files its script read and the device's load are as they were (docs/clusters.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autobatch.cache.folder import CacheFolder, stamp
from autobatch.cache.keys import TuneInputs
from autobatch.cache.sources import changed_files
from autobatch.records.result import WARNING, Circumstance, TuneResult

SUFFIX = ".result.json"
#: More memory held by other processes than this (bytes) counts as a busier device.
BUSIER_TOLERANCE = 64 << 20


@dataclass
class StoredResult:
    key: str
    made: str
    inputs: dict[str, Any]
    device_used_bytes: int | None
    result: TuneResult
    #: The result's notes about the circumstances of the run that measured (:class:`Circumstance`).
    circumstances: list[str] = field(default_factory=list)


def busier(used_now: int | None, used_then: int | None, tolerance: int = BUSIER_TOLERANCE) -> bool:
    """Whether other processes hold more memory on the device now than when the result was made."""
    if used_now is None or used_then is None:
        return used_now != used_then  # known only one of the two times: not comparable
    return used_now > used_then + tolerance


class ResultStore:
    """The stored results of one cache folder.

    A file holds ``{"kind": "result", "key", "made", "inputs", "device_used_bytes", "result", "circumstances"}``:
    the inputs (:class:`autobatch.cache.keys.TuneInputs`), when it was made, the memory other processes held on the
    device then (CUDA, from NVML; None on the CPU), the complete result and which of its notes were about the
    circumstances of the run that measured (:class:`~autobatch.records.result.Circumstance`: its load, its
    environment), which :func:`served` says as that run's. It is served only when the stored
    inputs equal the current ones (not only the key, so a hash collision cannot serve a wrong answer), no file
    its script read changed, and the device is not :func:`busier`. A served result's file is touched, so
    ``cache clear --older-than`` counts from its last use.
    """

    def __init__(self, folder: CacheFolder) -> None:
        self.folder = folder
        self.changed: list[str] = []  # the files the script read that changed since the last result asked for

    def path(self, key: str) -> Path:
        return self.folder.path / f"{key}{SUFFIX}"

    def get(self, inputs: TuneInputs, device_used_bytes: int | None = None) -> StoredResult | None:
        """The stored result for these inputs, if there is one and the device is not busier now."""
        if not inputs.cacheable:
            return None
        path = self.path(inputs.key())
        stored = self.read(path)
        if stored is None or stored.inputs != json.loads(json.dumps(inputs.to_dict())):
            return None
        self.changed = changed_files(read_files(stored.result))
        if self.changed or busier(device_used_bytes, stored.device_used_bytes):
            return None
        self.folder.touch(path)
        return stored

    def read(self, path: Path) -> StoredResult | None:
        """The stored result in ``path`` (None when absent; a damaged file is moved aside)."""
        data = self.folder.read_json(path, "stored result")
        if data is None:
            return None
        try:
            if data.get("kind") != "result":
                raise ValueError("not a stored result")
            result = TuneResult.from_dict(data["result"])
            return StoredResult(
                key=str(data["key"]),
                made=str(data["made"]),
                inputs=dict(data["inputs"]),
                device_used_bytes=data.get("device_used_bytes"),
                result=result,
                circumstances=[str(note) for note in data.get("circumstances") or []],
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self.folder.move_aside(path, f"not a stored result: {type(exc).__name__}: {exc}")
            return None

    def put(
        self, inputs: TuneInputs, result: TuneResult, device_used_bytes: int | None = None
    ) -> Path | None:
        """Store a complete result (a no-op for other statuses, or when the folder cannot be written)."""
        if not inputs.cacheable or result.status != "complete" or not self.folder.writable:
            return None
        if unfingerprinted(result):
            return None
        key = inputs.key()
        document = {
            "kind": "result",
            "key": key,
            "made": stamp(),
            "inputs": inputs.to_dict(),
            "device_used_bytes": device_used_bytes,
            "result": result.to_dict(),
            "circumstances": [note for note in result.notes if isinstance(note, Circumstance)],
        }
        return self.folder.write_json(self.path(key), document)


def read_files(result: TuneResult) -> dict[str, str | None]:
    """What the result's script read: path -> fingerprint (None: none could be taken)."""
    return dict((result.script_files or {}).get("read") or {})


def unfingerprinted(result: TuneResult) -> list[str]:
    """The files the script read that could not be fingerprinted: the result cannot be kept."""
    return [path for path, then in read_files(result).items() if then is None]


def served(
    stored: StoredResult, script: str, script_args: list[str], folder: str | None = None
) -> TuneResult:
    """The stored result as this run reports it: every probe marked cached, none run now, and what the run that
    measured warned of its own circumstances (the machine's load, its environment) said as that run's, with its
    date, not as this run's; its other notes of its circumstances (where its world size came from) are left to
    this run to state."""
    result = TuneResult.from_dict(stored.result.to_dict())
    result.script, result.script_args = script, list(script_args)
    when = result.created or stored.made
    result.notes = [
        said for note in result.notes if (said := _as_served(note, stored.circumstances, when)) is not None
    ]
    for combo in result.combinations:
        for record in combo.trace:
            record.cached = True
    result.probes = 0
    result.cache = {"key": stored.key, "served": True, "made": stored.made}
    if folder is not None:
        result.cache["folder"] = folder  # where the key's runtime evidence goes (the guard records there)
    return result


def _as_served(note: str, circumstances: list[str], when: str) -> str | None:
    """A stored note as a run served from the cache says it (None: left out)."""
    if note not in circumstances:
        return note
    if note.startswith(WARNING):
        return f"the run that measured, on {when}, warned: {note.removeprefix(WARNING)}"
    return None
