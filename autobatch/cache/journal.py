"""The probe journal: every probe's outcome, appended the moment it finishes, reused by a re-run.

One JSON-lines file per fingerprint (:func:`autobatch.cache.keys.fingerprint`),
``<cache_dir>/<fingerprint>.jsonl``, read, appended and replayed by :class:`ProbeJournal`. What a re-run
reuses and how a damaged file is handled is told in docs/clusters.md.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Optional

from autobatch.cache.folder import CacheFolder
from autobatch.core.levels import FULL, OFF
from autobatch.records.protocol import KINDS, ProbeOutcome, ProbeRequest

#: A probe's combination as the journal keys it: precision, optimizer, recomputation level, compile, sequence
#: length (or None).
Combination = tuple[str, str, str, bool, Optional[int]]
#: Outcome kinds the journal keeps.
JOURNALED = ("fits", "oom", "crash", "timeout")


def request_key(request: ProbeRequest) -> str:
    """What identifies a probe within one fingerprint: precision, optimizer, recompute, batch, steps, and then,
    only when one differs from its default (so that the keys of earlier probes stay as they were), a table of
    the sequence length, the partial or selective recomputation level, compile, and a timing probe's mark."""
    step = request.step
    extras = {
        "seq_len": step.seq_len,
        "level": step.level if step.level not in (OFF, FULL) else None,
        "compile": True if step.compile else None,
        "timing": True if request.timing else None,
    }
    extras = {k: v for k, v in extras.items() if v is not None}
    key = [step.precision, step.optimizer, step.recompute, step.batch_size]
    return json.dumps([*key, request.min_steps, request.max_steps, *([extras] if extras else [])])


def parsed_key(key: str) -> tuple[Combination, int, tuple[int, int]]:
    """(combination, batch, steps) of a request key."""
    precision, optimizer, recompute, batch, *rest = json.loads(key)
    extras = rest[2] if len(rest) > 2 and isinstance(rest[2], dict) else {}
    level = extras.get("level") or (FULL if recompute else OFF)
    combination = (
        str(precision),
        str(optimizer),
        str(level),
        bool(extras.get("compile")),
        extras.get("seq_len"),
    )
    return combination, int(batch), (int(rest[0]), int(rest[1]))


class Damaged(ValueError):
    """A journal file holds something that is not a journal entry."""


def parse_lines(text: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(meta, key -> outcome) of a journal's text; raises :class:`Damaged`.

    A last line without its newline is a write cut short and is skipped.
    """
    meta: dict[str, Any] = {}
    outcomes: dict[str, dict[str, Any]] = {}
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            if isinstance(entry, dict) and isinstance(entry.get("meta"), dict):
                meta = entry["meta"]
                continue
            key, outcome = entry["key"], entry["outcome"]
            if not isinstance(key, str) or outcome.get("kind") not in KINDS:
                raise ValueError("not a probe outcome")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            if number == len(lines):  # the last line, without a newline: cut short
                continue
            raise Damaged(f"line {number}: {exc}") from None
        outcomes[key] = outcome
    return meta, outcomes


class ProbeJournal:
    """The outcomes recorded under one fingerprint; without a folder they are kept in memory only.

    The file's first line describes the entry (``{"meta": {...}}``, for ``autobatch cache list``); each further
    line is one probe, ``{"key": ..., "outcome": {...}}``, keyed by :func:`request_key`. Answers (``fits``,
    ``oom``), crashes and timeouts are journaled (the session journals the last two only after its retry also
    failed); the script's own errors are measured again. A re-run's search starts from all of a combination's
    answers (:meth:`answers`), not only from the batches its path reaches again; a timeout is reused only by a
    request whose timeout is not longer (:func:`_too_short`), a probe that stopped at a search's margin line
    (:attr:`ProbeRequest.stop_above_bytes`) only by a request whose line its peak is above (:func:`_unsettled`).
    Appends hold the cache folder's lock, so two runs never interleave a line, and a run reads what another
    appended before each probe.
    """

    def __init__(
        self, folder: CacheFolder | None = None, key: str = "", meta: Mapping[str, Any] | None = None
    ):
        self.folder = folder
        self.key = key
        self.meta = dict(meta or {})
        self.path: Path | None = folder.path / f"{key}.jsonl" if folder is not None else None
        self._outcomes: dict[str, dict[str, Any]] = {}
        self._offset = 0  # bytes of the file read so far

    @classmethod
    def open(cls, folder: CacheFolder, key: str, meta: Mapping[str, Any] | None = None) -> ProbeJournal:
        """The journal of fingerprint ``key`` in ``folder``, loaded (a damaged file is moved aside)."""
        journal = cls(folder, key, meta)
        journal._refresh()
        return journal

    def __len__(self) -> int:
        return len(self._outcomes)

    def get(self, request: ProbeRequest) -> ProbeOutcome | None:
        """The recorded outcome of this probe (marked ``cached``), or None."""
        self._refresh()
        key = request_key(request)
        data = self._outcomes.get(key)
        if data is None or _too_short(data, request.timeout) or _unsettled(data, request.stop_above_bytes):
            return None
        outcome = ProbeOutcome.from_dict(data)
        outcome.cached = True
        return outcome

    def outcomes(self) -> list[tuple[Combination, ProbeOutcome]]:
        """Every recorded outcome with its :data:`Combination`, in file order."""
        self._refresh()
        return [(parsed_key(key)[0], ProbeOutcome.from_dict(data)) for key, data in self._outcomes.items()]

    def answers(
        self,
        combination: Combination,
        lengths: Collection[tuple[int, int]],
        timeout: float,
        stop_above: int | None = None,
    ) -> list[ProbeOutcome]:
        """What :meth:`get` would serve for one combination at these probe lengths ``(min_steps,
        max_steps)``, this timeout and this stop line, at every batch recorded, in file order, marked
        ``cached``."""
        self._refresh()
        out: list[ProbeOutcome] = []
        for key, data in self._outcomes.items():
            found, _batch, steps = parsed_key(key)
            if found != combination or steps not in lengths:
                continue
            if _too_short(data, timeout) or _unsettled(data, stop_above):
                continue
            outcome = ProbeOutcome.from_dict(data)
            outcome.cached = True
            out.append(outcome)
        return out

    def record(self, request: ProbeRequest, outcome: ProbeOutcome) -> None:
        """Keep an answer (``fits`` or ``oom``), a crash or a timeout, and append it to the file."""
        if outcome.kind not in JOURNALED:
            return
        key = request_key(request)
        data = outcome.to_dict()
        data["cached"] = False
        if outcome.kind == "timeout":
            data["timeout_seconds"] = request.timeout
        self._outcomes[key] = data
        self._append({"key": key, "outcome": data})

    # -- the file ------------------------------------------------------------------------------

    def _refresh(self) -> None:
        """Read what was appended since the last read (by this run or another)."""
        path = self.path
        if path is None:
            return
        try:
            size = path.stat().st_size
        except OSError:
            self._offset = 0
            return
        if size == self._offset:
            return
        if size < self._offset:  # replaced (cleared, moved aside): read it whole again
            self._offset = 0
        try:
            with open(path, "rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except OSError as exc:
            if self.folder is not None:
                self.folder.warn(f"cannot read the probe journal {path}: {exc}")
            return
        end = chunk.rfind(b"\n") + 1  # only whole lines; a line being appended is read next time
        try:
            meta, outcomes = parse_lines(chunk[:end].decode("utf-8"))
        except (Damaged, UnicodeDecodeError) as exc:
            self._damaged(path, str(exc))
            return
        self.meta = {**meta, **self.meta} if self._offset == 0 else self.meta
        self._outcomes.update(outcomes)
        self._offset += end

    def _damaged(self, path: Path, why: str) -> None:
        assert self.folder is not None
        self.folder.move_aside(path, why)
        self._offset = 0

    def _append(self, entry: dict[str, Any]) -> None:
        folder, path = self.folder, self.path
        if folder is None or path is None or not folder.writable:
            return
        try:
            with folder.lock():
                with open(path, "ab+") as handle:
                    _drop_cut_line(handle)
                    lines = [json.dumps({"meta": self.meta})] if handle.tell() == 0 else []
                    lines.append(json.dumps(entry))
                    handle.write(("\n".join(lines) + "\n").encode())
        except OSError as exc:
            folder.unwritable(exc)


def _too_short(data: Mapping[str, Any], timeout: float) -> bool:
    """A timeout that ran out of a shorter time than ``timeout`` allows: it says nothing about a longer one."""
    return data.get("kind") == "timeout" and float(data.get("timeout_seconds", 0.0)) < timeout


def _unsettled(data: Mapping[str, Any], stop_above: int | None) -> bool:
    """A probe that stopped at a search's line (its peak crossed the budget less the margin) answers only a
    request whose own line its peak is also above: not ``check`` (no line: every step, the cap's verdict),
    nor a search under a smaller margin."""
    if data.get("stopped_above_bytes") is None:
        return False
    return stop_above is None or int(data.get("peak_bytes") or 0) <= stop_above


def _drop_cut_line(handle: Any) -> None:
    """Cut off a last line that a crashed writer left without its newline (the caller holds the lock)."""
    handle.seek(0, 2)
    size = handle.tell()
    if size == 0:
        return
    handle.seek(size - 1)
    if handle.read(1) == b"\n":
        return
    handle.seek(0)
    keep = handle.read().rfind(b"\n") + 1
    handle.truncate(keep)
    handle.seek(keep)
