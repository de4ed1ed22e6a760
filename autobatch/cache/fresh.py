"""The job's fresh process, kept for the next run: what a fresh ``python`` running the script holds.

On the CPU a run measures how much more the job's fresh process holds than a probe forked from the probe
server (:mod:`autobatch.probe.fresh`). The fresh half takes seconds (a new Python imports torch and the
script); the forked half is one short probe on the run's own server, whose baseline differs from run to run
and from one kind of server to another. :class:`FreshStore` keeps the fresh half, per rank, in
``<cache_dir>/<key>.fresh.json``; the next ``tune`` or ``check`` of the same script in the same environment
measures the forked half alone and counts against the kept one. It is used only while its inputs
(:class:`FreshInputs`) are equal and no file the script read changed; ``--refresh`` and ``--no-cache``
measure both halves.
"""

from __future__ import annotations

import json
import os
import site
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autobatch.cache.folder import CacheFolder, stamp
from autobatch.cache.keys import digest
from autobatch.cache.sources import changed_files, file_fingerprint

SUFFIX = ".fresh.json"


def interpreter() -> dict[str, Any]:
    """The interpreter and its installed packages: the executable, and each site folder's last change (a
    package installed or removed changes its folder)."""
    folders = [*site.getsitepackages(), site.getusersitepackages()]
    changed = {}
    for folder in folders:
        try:
            changed[folder] = os.stat(folder).st_mtime_ns
        except OSError:
            continue
    return {"executable": sys.executable, "site": changed}


@dataclass(frozen=True)
class FreshInputs:
    """What the job's fresh process holds depends on: the script, its arguments, the versions, the
    interpreter and its packages, the environment, and how the step runs (device, ranks, length)."""

    sources: dict[str, str]
    script_args: list[str]
    versions: dict[str, str]
    step: dict[str, Any]
    interpreter: dict[str, Any]
    environment: dict[str, str]

    def key(self) -> str:
        return digest(self.to_dict().values())

    def to_dict(self) -> dict[str, Any]:
        """The inputs as their file holds them (a value JSON cannot hold, such as a path, as its text)."""
        inputs = {
            "sources": self.sources,
            "script_args": self.script_args,
            "versions": self.versions,
            "step": self.step,
            "interpreter": self.interpreter,
            "environment": self.environment,
        }
        return dict(json.loads(json.dumps(inputs, default=str)))


@dataclass(frozen=True)
class KeptFresh:
    """The job's fresh processes as a run measured them: per rank, data memory less autobatch's imports."""

    job_bytes: list[int]
    #: When (UTC, ISO 8601, to the second).
    made: str

    @classmethod
    def now(cls, job_bytes: list[int]) -> KeptFresh:
        return cls([int(b) for b in job_bytes], stamp())


class FreshStore:
    """The kept fresh processes of one cache folder: ``{"kind": "fresh", "key", "made", "script", "inputs",
    "job_bytes", "files_read"}`` per file."""

    def __init__(self, folder: CacheFolder) -> None:
        self.folder = folder

    def path(self, key: str) -> Path:
        return self.folder.path / f"{key}{SUFFIX}"

    def get(self, inputs: FreshInputs) -> KeptFresh | None:
        """The kept fresh processes for these inputs, while every file the script read is as it was."""
        path = self.path(inputs.key())
        data = self.folder.read_json(path, "kept fresh process")
        if data is None:
            return None
        try:
            if data.get("kind") != "fresh" or data["inputs"] != inputs.to_dict():
                return None
            if changed_files(dict(data["files_read"])):
                return None
            kept = KeptFresh([int(b) for b in data["job_bytes"]], str(data["made"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            self.folder.move_aside(path, f"not a kept fresh process: {type(exc).__name__}: {exc}")
            return None
        self.folder.touch(path)
        return kept

    def put(
        self, inputs: FreshInputs, measured: KeptFresh, script: str, files_read: list[str]
    ) -> Path | None:
        """Keep a fresh process measured for ``script`` (nothing when a file it read cannot be fingerprinted, or
        the folder cannot be written)."""
        read = {path: file_fingerprint(path) for path in files_read}
        if any(then is None for then in read.values()):
            return None
        key = inputs.key()
        document = {
            "kind": "fresh",
            "key": key,
            "made": measured.made,
            "script": script,
            "inputs": inputs.to_dict(),
            "job_bytes": [int(b) for b in measured.job_bytes],
            "files_read": read,
        }
        return self.folder.write_json(self.path(key), document)
