"""What the guard records: each change of the micro-batch (an event), the run's peak, a summary, and the run's
runtime evidence in the cache.

Events go to the ``autobatch`` logger and, when a path is given, to a JSON Lines file (one object a line,
flushed as written). The summary is a plain value (:class:`GuardSummary`, JSON-able through
:meth:`GuardSummary.to_dict`). When the guard knows the tuned key of its plan (:class:`Evidence`), the run's
end goes into that key's runtime evidence (:class:`autobatch.cache.evidence.EvidenceStore`) through
:class:`EvidenceRecorder`. The peak is the device's, as the tune's probes measured it: on CUDA
``torch.cuda.max_memory_reserved``; on the CPU the process's data high-water mark, read as the CPU device reads a
probe's (:class:`autobatch.devices.cpu.DataPeak`, from the guard's start).
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Optional

from autobatch.cache.evidence import Event, EvidenceStore
from autobatch.cache.folder import CacheFolder
from autobatch.devices.cpu import DataPeak, read_status

logger = logging.getLogger("autobatch")


@dataclass(frozen=True)
class GuardEvent:
    """One change: at global batch ``step`` (0-based), the micro-batch went from ``old`` to ``new``."""

    step: int
    old: int
    new: int
    reason: str  # out of memory | allocator retries | grow
    peak_bytes: Optional[int]
    rank: int = 0
    samples: int = 0  # the per-rank batch that was running
    shapes: list[list[int]] = field(
        default_factory=list
    )  # its tensors' shapes (for "ran out with these shapes")
    ran_out: bool = False  # this rank ran out of memory (another rank's failure lowers it too)

    def to_dict(self) -> dict[str, Any]:
        return {"event": "micro-batch", **asdict(self)}

    def __str__(self) -> str:
        peak = f", peak {self.peak_bytes / 2**20:.0f} MiB" if self.peak_bytes is not None else ""
        verb = "raised" if self.new > self.old else "lowered"
        return f"guard: step {self.step}: micro-batch {verb} {self.old} -> {self.new} ({self.reason}{peak})"


@dataclass
class GuardSummary:
    """The run so far: global batches completed, the sizes it started at and holds now, its events and peak."""

    steps: int = 0
    start_micro_batch_size: int = 0
    micro_batch_size: int = 0
    smallest_micro_batch_size: int = 0
    out_of_memory: int = 0  # out-of-memory failures handled: each lowered and ran its batch again (any rank)
    peak_bytes: Optional[int] = None
    events: list[GuardEvent] = field(default_factory=list)

    @property
    def held(self) -> bool:
        """True while the micro-batch never had to be lowered."""
        return not any(e.new < e.old for e in self.events)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["events"] = [e.to_dict() for e in self.events]
        data["held"] = self.held
        return data


class PeakMeter:
    """The device's peak since the guard started (bytes), in the quantity the tune's budget caps and its probes
    measured: on CUDA the caching allocator's reserved memory (segments, fragmentation included), which is never
    below the memory its tensors hold (``max_memory_allocated``) and is what runs out."""

    HOW = {
        "cuda": "torch.cuda.max_memory_reserved",
        "cpu": "the process's data high-water mark (VmPeak less non-data mappings), read from /proc/self/status",
    }

    def __init__(self, device_type: str, device_index: int | None = None) -> None:
        self.device_type = device_type
        self.device_index = device_index
        self.data_peak = DataPeak(read_status()) if device_type == "cpu" else None

    def peak(self) -> int | None:
        if self.device_type == "cuda":
            import torch

            return int(torch.cuda.max_memory_reserved(self.device_index))
        if self.data_peak is not None:
            try:
                return self.data_peak.read(read_status())
            except (OSError, KeyError):
                return None
        return None

    def alloc_retries(self) -> int:
        """CUDA's ``num_alloc_retries`` so far (0 elsewhere: the CPU allocator does not retry)."""
        if self.device_type != "cuda":
            return 0
        import torch

        return int(torch.cuda.memory_stats(self.device_index).get("num_alloc_retries", 0))


class EventLog:
    """Writes events to the logger and, when given a path, to a JSON Lines file (appended, line by line).

    The file's last line is the summary so far (``"final": false``), rewritten in place as the run goes
    (:meth:`summary`), until :meth:`close` writes the last one (``"final": true``): a job that a signal ends
    (SIGTERM, which skips ``with`` blocks and ``atexit``) keeps a summary of what it did, up to its last update."""

    def __init__(self, path: str | Path | None, rank: int = 0) -> None:
        self.rank = rank
        self.handle: IO[str] | None = None
        self._summary_at: int | None = None  # where the summary so far starts in the file
        if path is not None:
            text = str(path)
            if "{rank}" in text:
                text = text.replace("{rank}", str(rank))
            elif rank != 0:
                return  # one file for the group: rank 0 writes it (every rank agrees on every change)
            target = Path(text)
            target.parent.mkdir(parents=True, exist_ok=True)
            self.handle = target.open("a", encoding="utf-8")

    def event(self, event: GuardEvent) -> None:
        if event.new < event.old:
            logger.warning("%s", event)
        else:
            logger.info("%s", event)
        self.write(event.to_dict())

    def write(self, record: dict[str, Any]) -> None:
        """Append a line in place of the summary so far (the guard writes the summary again after a change)."""
        if self.handle is not None:
            self._drop_summary()
            self.handle.write(json.dumps(record) + "\n")
            self.handle.flush()

    def summary(self, summary: GuardSummary, final: bool = False) -> None:
        """Write ``summary`` as the file's last line, in place of the summary so far."""
        if self.handle is not None:
            record = summary.to_dict()
            record.pop("events")
            self._drop_summary()
            start = os.fstat(self.handle.fileno()).st_size
            self.handle.write(json.dumps({"event": "summary", **record, "final": final}) + "\n")
            self.handle.flush()
            self._summary_at = None if final else start

    def close(self, summary: GuardSummary) -> None:
        if self.handle is not None:
            self.summary(summary, final=True)
            self.handle.close()
            self.handle = None

    def _drop_summary(self) -> None:
        assert self.handle is not None
        if self._summary_at is not None:
            self.handle.truncate(self._summary_at)
            self._summary_at = None


@dataclass(frozen=True)
class Evidence:
    """Where a guarded run's evidence goes, and what the tune said: the tuned result's cache ``key`` in the
    folder ``cache_dir`` (None: ``AUTOBATCH_CACHE_DIR``, else the user's cache folder), the tune's peak at the
    plan's micro-batch and its budget (for the early warning), and the plan's accumulation and world size."""

    key: str
    cache_dir: str | None = None
    tuned_peak_bytes: int | None = None
    budget_bytes: int | None = None
    accumulation_steps: int = 1
    world_size: int = 1


class EvidenceRecorder:
    """Records a guarded run under its tuned key (the cache's runtime evidence): each change of the micro-batch
    as it happens, so that a job ended by a signal (a preemption's SIGTERM) keeps what it saw, and the run's end
    once.

    Rank 0 records the run (how it ended, steps held, peak against the tuned peak) and the guard's other changes;
    an out-of-memory lowering is recorded by every rank that ran out itself, with its own batch's shapes."""

    def __init__(self, evidence: Evidence, rank: int, device_type: str) -> None:
        self.evidence = evidence
        self.rank = rank
        self.peak_how = PeakMeter.HOW.get(device_type)
        self.run = uuid.uuid4().hex[:12]
        self.done = False

    def change(self, event: GuardEvent) -> None:
        """Append one change of the micro-batch now, when this rank records it (see the class)."""
        if event.ran_out if event.reason == "out of memory" else self.rank == 0:
            self._store(
                Event(
                    kind="change",
                    micro_batch_size=event.old,
                    new_micro_batch_size=event.new,
                    step=event.step,
                    reason=event.reason,
                    peak_bytes=event.peak_bytes,
                    shapes=event.shapes or None,
                    extra={"run": self.run, "rank": event.rank, "samples": event.samples},
                    **self._common(),
                )
            )

    def record(
        self, summary: GuardSummary, outcome: str, reason: str = "", shapes: list[list[int]] | None = None
    ) -> None:
        """Append the run's end (once, on rank 0): how it ended, the batches it completed, its peak."""
        if self.done:
            return
        self.done = True
        if self.rank != 0:
            return
        ev = self.evidence
        self._store(
            Event(
                kind="run",
                micro_batch_size=summary.start_micro_batch_size,
                outcome=outcome,
                step=summary.steps,
                new_micro_batch_size=summary.micro_batch_size,
                peak_bytes=summary.peak_bytes,
                peak_how=self.peak_how if summary.peak_bytes else None,
                tuned_peak_bytes=ev.tuned_peak_bytes,
                budget_bytes=ev.budget_bytes,
                reason=reason,
                shapes=shapes or None,
                extra={
                    "run": self.run,
                    "smallest": summary.smallest_micro_batch_size,
                    "reruns": summary.out_of_memory,
                },
                **self._common(),
            )
        )

    def _common(self) -> dict[str, Any]:
        ev = self.evidence
        return {"source": "guard", "accumulation_steps": ev.accumulation_steps, "world_size": ev.world_size}

    def _store(self, event: Event) -> None:
        """Append one line under the folder's lock (a folder that cannot be written is warned about)."""
        folder = CacheFolder(
            self.evidence.cache_dir or os.environ.get("AUTOBATCH_CACHE_DIR"), warn=logger.warning
        )
        EvidenceStore(folder).record(self.evidence.key, event)


__all__ = ["Evidence", "EvidenceRecorder", "EventLog", "GuardEvent", "GuardSummary", "PeakMeter"]
