"""The probe journal: every probe's outcome, appended the moment it finishes, reused by a re-run.

One JSON-lines file per fingerprint (the script's bytes and arguments, the autobatch and torch
versions, the device, the budget, the optimizer arguments and recomputed classes) in the
``cache_dir`` setting's folder. An interrupted run keeps what it measured and a re-run of the same
tune is instant. Answers (``fits``, ``oom``) are journaled, and so are crashes and timeouts (the
session journals them only after its retry also failed, so a re-run does not pay for them again); a
timeout is reused only by a request whose timeout is not longer than the one that ran out. The
script's own errors are measured again. A line cut short by a crash is skipped.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .protocol import ProbeOutcome, ProbeRequest

#: Outcome kinds the journal keeps.
JOURNALED = ("fits", "oom", "crash", "timeout")


def fingerprint(script_bytes: bytes, parts: Iterable[Any]) -> str:
    """A short digest of the script's bytes and everything else that decides a probe's outcome."""
    digest = hashlib.sha256()
    digest.update(script_bytes)
    for part in parts:
        digest.update(json.dumps(part, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def default_folder() -> Path:
    """``<user cache>/autobatch/probes`` (platformdirs)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("autobatch")) / "probes"


def request_key(request: ProbeRequest) -> str:
    """What identifies a probe within one fingerprint."""
    return json.dumps(
        [
            request.precision,
            request.optimizer,
            request.recompute,
            request.batch_size,
            request.min_steps,
            request.max_steps,
        ]
    )


class ProbeJournal:
    """The outcomes recorded under one fingerprint; ``path`` None keeps them in memory only."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._outcomes: dict[str, dict[str, Any]] = {}
        self._timeouts: dict[str, float] = {}  # the timeout a journaled timeout ran under
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():
                self._load(path)

    @classmethod
    def open(cls, folder: str | Path | None, key: str) -> ProbeJournal:
        """The journal of fingerprint ``key`` in ``folder`` (the default cache folder when None)."""
        return cls(Path(folder or default_folder()) / f"{key}.jsonl")

    def _load(self, path: Path) -> None:
        for line in path.read_text().splitlines():
            try:
                entry = json.loads(line)
                self._outcomes[entry["key"]] = entry["outcome"]
                if "timeout" in entry:
                    self._timeouts[entry["key"]] = float(entry["timeout"])
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a crash

    def get(self, request: ProbeRequest) -> ProbeOutcome | None:
        """The recorded outcome of this probe (marked ``cached``), or None."""
        key = request_key(request)
        data = self._outcomes.get(key)
        if data is None:
            return None
        if data.get("kind") == "timeout" and self._timeouts.get(key, 0.0) < request.timeout:
            return None  # ran out of a shorter time than this request allows
        outcome = ProbeOutcome.from_dict(data)
        outcome.cached = True
        return outcome

    def record(self, request: ProbeRequest, outcome: ProbeOutcome) -> None:
        """Keep an answer (``fits`` or ``oom``), a crash or a timeout, and append it to the file."""
        if outcome.kind not in JOURNALED:
            return
        key = request_key(request)
        self._outcomes[key] = outcome.to_dict()
        entry: dict[str, Any] = {"key": key, "outcome": outcome.to_dict()}
        if outcome.kind == "timeout":
            self._timeouts[key] = entry["timeout"] = request.timeout
        if self.path is not None:
            with open(self.path, "a") as handle:
                handle.write(json.dumps(entry) + "\n")
