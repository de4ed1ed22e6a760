"""What jobs saw at runtime, kept beside the stored result of the tune they ran with.

``<cache_dir>/<key>.evidence.jsonl`` holds one :class:`Event` a line, keyed by the tuned result's key
(:meth:`autobatch.cache.keys.TuneInputs.key`): ``autobatch run`` records each launch of a job (how it ended,
the micro-batch it ran, its real peak against the tuned one), and the in-loop guard records each guarded run
(how many steps it held, its peak) and each lowering of its micro-batch (the step and the batch's shapes). A
line is appended whole under the folder's lock, so writers on several nodes never interleave; a line that
cannot be read is skipped. ``autobatch cache show`` lists the events, and the next tune of the key sums them
up in its notes (:func:`summary`, one sentence for both sources).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from autobatch.cache.folder import CacheFolder, stamp
from autobatch.core.units import format_bytes

SUFFIX = ".evidence.jsonl"


@dataclass(frozen=True)
class Event:
    """One thing a job did that says whether its plan held.

    ``source``: who saw it (``run``, ``guard``); ``kind``: ``launch`` (one launch of a job and how it ended:
    ``outcome`` ``exit``, ``oom``, ``signal``, or ``guard`` when its own guard's ``GuardError`` ended it, the
    error's message in ``reason`` and its hint in ``extra``), ``run`` (one guarded run and how it ended: ``exit``, ``oom``
    when it ran out even one sample at a time, ``error`` when the script's own exception ended it; ``step`` the
    global batches it completed, ``new_micro_batch_size`` the size at its end) or ``change`` (at batch
    ``step`` the guard's micro-batch changed to ``new_micro_batch_size``; ``shapes`` the batch's tensors).
    Sizes are per rank; bytes are the job's real peak (``peak_bytes``, how measured in ``peak_how``) and the
    tune's (``tuned_peak_bytes``) against the tune's ``budget_bytes``."""

    source: str
    kind: str
    micro_batch_size: int
    accumulation_steps: int
    world_size: int = 1
    outcome: str | None = None
    exit_code: int | None = None
    launch: int | None = None  # 1 for a job's first launch, 2 for its first relaunch, ...
    step: int | None = None
    new_micro_batch_size: int | None = None
    peak_bytes: int | None = None
    peak_how: str | None = None
    tuned_peak_bytes: int | None = None
    budget_bytes: int | None = None
    reason: str = ""
    shapes: list[list[int]] | None = None
    at: str = ""  # when it was recorded (UTC, ISO 8601); set by :meth:`EvidenceStore.record` when empty
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, "", {})}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def line(self) -> str:
        """The event in words, as ``cache show`` and the tune's notes give it."""
        where = f"micro-batch {self.micro_batch_size} x accumulation {self.accumulation_steps}"
        where += f" x world {self.world_size}" if self.world_size > 1 else ""
        peak = (
            f"; peak {format_bytes(self.peak_bytes)}"
            + (f" (tuned {format_bytes(self.tuned_peak_bytes)})" if self.tuned_peak_bytes else "")
            + (f" of budget {format_bytes(self.budget_bytes)}" if self.budget_bytes else "")
            if self.peak_bytes
            else ""
        )
        if self.kind == "change":
            what = f"step {self.step}: micro-batch {self.micro_batch_size} -> {self.new_micro_batch_size}"
            what += f" ({self.reason})" if self.reason else ""
            what += f" with shapes {_shapes(self.shapes)}" if self.shapes else ""
            return f"{self.at} {self.source}: {what}{peak}"
        if self.kind == "run":
            ended = {
                "exit": f"held for {self.step} steps",
                "oom": f"ran out of memory at step {self.step} even one sample at a time",
                "error": f"stopped at step {self.step} by the script's error",
            }.get(self.outcome or "", f"{self.outcome} at step {self.step}")
            end = self.new_micro_batch_size
            where += f", at {end} at the end" if end is not None and end != self.micro_batch_size else ""
            where += f", shapes {_shapes(self.shapes)}" if self.shapes else ""
            why = f": {self.reason}" if self.reason and self.outcome != "exit" else ""
            return f"{self.at} {self.source}: {ended} ({where}){peak}{why}"
        launch = f" launch {self.launch}" if self.launch else ""
        ended = {
            "exit": f"exited {self.exit_code}",
            "oom": "ran out of memory",
            "signal": f"stopped by a signal (exit {self.exit_code})",
            "guard": f"ended by its guard's error (exit {self.exit_code})",
        }.get(self.outcome or "", self.outcome or "?")
        why = f": {self.reason}" if self.reason and self.outcome != "exit" else ""
        return f"{self.at} {self.source}{launch}: {ended} at {where}{peak}{why}"


class EvidenceStore:
    """The runtime evidence of one cache folder, one file per tuned key."""

    def __init__(self, folder: CacheFolder) -> None:
        self.folder = folder

    def path(self, key: str) -> Path:
        return self.folder.path / f"{key}{SUFFIX}"

    def record(self, key: str, event: Event) -> bool:
        """Append ``event`` to ``key``'s evidence (False when the folder cannot be written: warned once)."""
        if not self.folder.writable:
            return False
        if not event.at:
            now = stamp()
            event = Event.from_dict({**event.to_dict(), "at": now})
        data = (json.dumps(event.to_dict(), sort_keys=True) + "\n").encode()
        try:
            with self.folder.lock():
                fd = os.open(self.path(key), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, data)  # one write of a whole line, appended
                finally:
                    os.close(fd)
        except OSError as exc:
            self.folder.unwritable(exc)
            return False
        return True

    def read(self, key: str) -> list[Event]:
        """Every event recorded for ``key``, oldest first (none when there is no file)."""
        try:
            text = self.path(key).read_text(errors="replace")
        except OSError:
            return []
        return parse(text)


def parse(text: str) -> list[Event]:
    """The events of an evidence file's text; a line that is not an event is skipped."""
    events = []
    for line in text.splitlines():
        try:
            data = json.loads(line)
            events.append(Event.from_dict(data))
        except (ValueError, TypeError):
            continue
    return events


def summary(events: list[Event]) -> str | None:
    """What jobs saw of a tuned key, in one sentence for the tune's notes (None: nothing recorded): the launches
    of ``autobatch run`` and the runs of the guard, where they ran out of memory, and the highest peak."""
    if not events:
        return None
    parts = _launches([e for e in events if e.kind == "launch"]) + _guarded(events)
    peaks = [e for e in events if e.peak_bytes and e.budget_bytes]
    if peaks:
        worst = max(peaks, key=lambda e: e.peak_bytes or 0)
        parts.append(
            f"highest peak {format_bytes(worst.peak_bytes)} of budget {format_bytes(worst.budget_bytes)}"
        )
    recorded = "; ".join(parts) or f"{len(events)} event(s)"
    return f"runtime evidence of this tune's jobs: {recorded} (`autobatch cache show` lists each)"


#: Out-of-memory lowerings named one by one in the summary (the latest); the rest are counted.
NAMED_LOWERINGS = 3


def _launches(launches: list[Event]) -> list[str]:
    parts = []
    held = [e for e in launches if e.outcome == "exit" and e.exit_code == 0]
    if held:
        sizes = ", ".join(str(m) for m in sorted({e.micro_batch_size for e in held}))
        parts.append(f"held for {len(held)} launch(es) to exit 0 at micro-batch {sizes}")
    ran_out = sorted({e.micro_batch_size for e in launches if e.outcome == "oom"})
    if ran_out:
        parts.append(f"ran out of memory at micro-batch {', '.join(str(m) for m in ran_out)}")
    gave_up = sorted({e.micro_batch_size for e in launches if e.outcome == "guard"})
    if gave_up:
        parts.append(f"the job's guard gave up at micro-batch {', '.join(str(m) for m in gave_up)}")
    return parts


def _guarded(events: list[Event]) -> list[str]:
    """The guard's runs: steps held, and each batch that ran out (its step, shapes and the sizes it went
    through: one lowering event per rung, merged per batch)."""
    parts = []
    runs = [e for e in events if e.source == "guard" and e.kind == "run"]
    held = [e for e in runs if e.outcome == "exit"]
    if held:
        parts.append(f"the guard held for {sum(e.step or 0 for e in held)} steps in {len(held)} run(s)")
    batches: dict[tuple[object, int | None, str], list[Event]] = {}
    for e in events:
        if e.source == "guard" and e.kind == "change" and e.reason == "out of memory":
            batches.setdefault((e.extra.get("run"), e.step, _shapes(e.shapes)), []).append(e)
    lowered = [
        f"at step {step} with shapes {shapes or '?'} (micro-batch {moves[0].micro_batch_size} -> "
        f"{moves[-1].new_micro_batch_size})"
        for (_, step, shapes), moves in batches.items()
    ]
    if lowered:
        more = len(lowered) - NAMED_LOWERINGS
        named = "; ".join(lowered[-NAMED_LOWERINGS:]) + (f"; and {more} more" if more > 0 else "")
        parts.append(f"ran out of memory {named}")
    for e in runs:
        if e.outcome == "oom":
            parts.append(
                f"ran out of memory at step {e.step} even one sample at a time"
                + (f" with shapes {_shapes(e.shapes)}" if e.shapes else "")
            )
    return parts


def _shapes(shapes: list[list[int]] | None) -> str:
    return " ".join(f"[{', '.join(str(d) for d in shape)}]" for shape in shapes or [])
