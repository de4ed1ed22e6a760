"""What a cache folder holds, for ``autobatch cache list | show KEY | clear [--older-than AGE]``.

Entries are the stored results (``KEY.result.json``), the probe journals (``KEY.jsonl``), what jobs saw at
runtime (``KEY.evidence.jsonl``, :mod:`autobatch.cache.evidence`), the kept fresh processes
(``KEY.fresh.json``, :mod:`autobatch.cache.fresh`) and damaged files that a run moved aside
(``NAME.corrupt-STAMP``). An entry's age is the time since it was last
written or served (a served result's file is touched). Clearing holds the folder's lock, so a run
writing at the same moment is never left with half a file; a run that still has a journal open keeps
appending to a new file of the same name.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autobatch.cache.evidence import SUFFIX as EVIDENCE_SUFFIX
from autobatch.cache.evidence import parse as parse_evidence
from autobatch.cache.folder import CacheFolder
from autobatch.cache.fresh import SUFFIX as FRESH_SUFFIX
from autobatch.cache.journal import Damaged, parse_lines
from autobatch.cache.results import SUFFIX
from autobatch.core.units import format_bytes
from autobatch.errors import UsageError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass
class Entry:
    key: str
    kind: str  # "result" | "journal" | "evidence" | "fresh" | "damaged"
    path: Path
    size: int
    modified: float
    script: str | None = None
    device: str | None = None
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def age(self) -> float:
        return max(0.0, time.time() - self.modified)

    def summary(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "kind": self.kind,
            "path": str(self.path),
            "bytes": self.size,
            "modified": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.modified)),
            "script": self.script,
            "device": self.device,
            "detail": self.detail,
        }


def parse_age(text: str) -> float:
    """``90s``, ``30m``, ``12h``, ``7d``, ``2w`` -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    if not match:
        raise UsageError(
            f"cannot read the age {text!r}: a number and a unit, such as 7d",
            hint="give a number and a unit: 90s, 30m, 12h, 7d or 2w",
        )
    return float(match.group(1)) * _UNITS[match.group(2)]


def entries(folder: CacheFolder) -> list[Entry]:
    """Every entry of the folder, newest first."""
    found = [_result(folder, p) for p in folder.files(f"*{SUFFIX}")]
    found += [_journal(p) for p in folder.files("*.jsonl") if not p.name.endswith(EVIDENCE_SUFFIX)]
    found += [_evidence(p) for p in folder.files(f"*{EVIDENCE_SUFFIX}")]
    found += [_fresh(p) for p in folder.files(f"*{FRESH_SUFFIX}")]
    found += [_damaged(p) for p in folder.files("*.corrupt-*")]
    return sorted(found, key=lambda e: -e.modified)


def find(folder: CacheFolder, key: str) -> list[Entry]:
    """The entries whose key starts with ``key`` (a result and a journal can share one)."""
    key = key.strip()
    if not key:
        raise UsageError("no cache key given", hint="`autobatch cache list` shows the keys")
    return [e for e in entries(folder) if e.key.startswith(key)]


def clear(folder: CacheFolder, older_than: float | None = None) -> list[Entry]:
    """Remove the entries older than ``older_than`` seconds (every entry when None); return them."""
    doomed = [e for e in entries(folder) if older_than is None or e.age > older_than]
    removed = []
    with folder.lock():
        for entry in doomed:
            try:
                entry.path.unlink()
                removed.append(entry)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise UsageError(
                    f"cannot remove {entry.path}: {exc.strerror or exc}",
                    hint="check the folder's permissions (the cache_dir setting names it)",
                ) from None
    return removed


def _stat(path: Path) -> tuple[int, float]:
    try:
        info = path.stat()
        return info.st_size, info.st_mtime
    except OSError:
        return 0, 0.0


def _result(folder: CacheFolder, path: Path) -> Entry:
    size, modified = _stat(path)
    key = path.name[: -len(SUFFIX)]
    try:
        data = json.loads(path.read_text())
        result, inputs = data["result"], data["inputs"]
        chosen = result.get("chosen") or {}
        detail = (
            f"{chosen.get('precision')}/{chosen.get('optimizer')}/"
            f"{'recompute' if chosen.get('recompute') else 'no-recompute'} micro-batch "
            f"{chosen.get('micro_batch_size')} x {chosen.get('accumulation_steps')}"
            if chosen
            else "no combination chosen"
        )
        identity = inputs.get("device", {})
        device = identity.get("name") or identity.get("processor") or identity.get("type")
        return Entry(key, "result", path, size, modified, result.get("script"), device, detail, data)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return Entry(key, "damaged", path, size, modified, detail=f"unreadable stored result ({exc})")


def _journal(path: Path) -> Entry:
    size, modified = _stat(path)
    try:
        meta, outcomes = parse_lines(path.read_text())
    except (OSError, UnicodeDecodeError, Damaged) as exc:
        return Entry(path.stem, "damaged", path, size, modified, detail=f"damaged journal ({exc})")
    identity = meta.get("identity") or {}
    device = identity.get("name") or meta.get("device")
    data = {"meta": meta, "probes": outcomes}
    budget = meta.get("budget_bytes")
    detail = f"{len(outcomes)} probes" + (f", budget {format_bytes(int(budget))}" if budget else "")
    return Entry(path.stem, "journal", path, size, modified, meta.get("script"), device, detail, data)


def _evidence(path: Path) -> Entry:
    size, modified = _stat(path)
    key = path.name[: -len(EVIDENCE_SUFFIX)]
    try:
        events = parse_evidence(path.read_text(errors="replace"))
    except OSError as exc:
        return Entry(key, "damaged", path, size, modified, detail=f"unreadable runtime evidence ({exc})")
    data = {"events": [e.to_dict() for e in events]}
    return Entry(key, "evidence", path, size, modified, detail=f"{len(events)} runtime event(s)", data=data)


def _fresh(path: Path) -> Entry:
    size, modified = _stat(path)
    key = path.name[: -len(FRESH_SUFFIX)]
    try:
        data = json.loads(path.read_text())
        detail = "the job's fresh process: " + ", ".join(format_bytes(int(b)) for b in data["job_bytes"])
        device = data["inputs"]["step"]["device"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return Entry(key, "damaged", path, size, modified, detail=f"unreadable kept fresh process ({exc})")
    script = data.get("script")
    return Entry(key, "fresh", path, size, modified, script, device, detail, data)


def _damaged(path: Path) -> Entry:
    size, modified = _stat(path)
    key = path.name.split(".", 1)[0]
    return Entry(key, "damaged", path, size, modified, detail="moved aside by a run (damaged)")
