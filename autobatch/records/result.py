"""The result of a tune: a public, versioned JSON document (``tune --json`` and the result file).

Holds the record classes (:class:`TuneResult`, :class:`ComboResult`, :class:`Chosen`, :class:`ProbeRecord`), their
JSON form and :meth:`TuneResult.load`, which checks a file against the published JSON Schema
(:mod:`autobatch.records.schema`). Fields are only ever added, never renamed or removed. Every field is
described in docs/result-file.md.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autobatch.core.levels import FULL, OFF
from autobatch.core.overflow import Measured
from autobatch.core.space import SCRIPT_OWN, Combo, Ident, ident_of
from autobatch.core.units import format_bytes
from autobatch.errors import AutobatchError, NoBlocksError, NothingFitsError, ProbeFailure
from autobatch.records.schema import SCHEMA_VERSION
from autobatch.settings.levers import Door, in_words, lever

if TYPE_CHECKING:
    from autobatch.core.plan import Plan
    from autobatch.records.protocol import ProbeOutcome

__all__ = [
    "SCHEMA_VERSION",
    "Chosen",
    "Circumstance",
    "ComboResult",
    "ProbeRecord",
    "TuneResult",
    "WARNING",
    "warning_note",
]
#: Fields added after the first release that are left out of the document while unset.
_ABSENT_WHEN_NONE = (
    "cache",
    "devices",
    "pid",
    "host",
    "as_is",
    "lengths",
    "script_files",
)  # written by a tune only


class Circumstance(str):
    """A note about the circumstances of the run that measured (the machine's load, the environment it ran in, the
    cache and lock folders it found), not about its answer: true of that run only. A result served from the cache
    says it as that run's, with its date (:func:`autobatch.cache.results.served`). The kind does not survive JSON:
    the cache keeps which notes were circumstances beside the result it stores."""


#: How a warning begins among a result's notes.
WARNING = "warning: "


def warning_note(message: str) -> str:
    """A warning as a result's note, ``warning: MESSAGE``; a circumstance's note is one too."""
    note = WARNING + message
    return Circumstance(note) if isinstance(message, Circumstance) else note


@dataclass
class ProbeRecord:
    """One probe as it appears in a combination's trace."""

    batch_size: int
    kind: str  # fits | oom | error | timeout | crash
    peak_bytes: int | None = None
    steps: int = 0
    seconds: float = 0.0
    samples_per_second: float | None = None
    cached: bool = False
    purpose: str = "search"  # search | confirm | throughput
    rank_peak_bytes: list[int] = field(default_factory=list)  # distributed: every rank's peak
    started_at: float | None = None  # when the probe ran (seconds since the epoch); absent in older results

    @classmethod
    def of(cls, outcome: ProbeOutcome, purpose: str = "search") -> ProbeRecord:
        """A probe's outcome as the trace shows it."""
        return cls(
            batch_size=outcome.batch_size,
            kind=outcome.kind,
            peak_bytes=outcome.peak_bytes,
            steps=outcome.steps,
            seconds=round(outcome.wall_seconds, 3),
            samples_per_second=outcome.samples_per_second,
            cached=outcome.cached,
            purpose=purpose,
            rank_peak_bytes=list(outcome.rank_peak_bytes),
            started_at=outcome.started_at,
        )


#: The statuses of a combination with a maximum (see :attr:`ComboResult.answered`).
ANSWERED = ("exact", "capped", "incomplete")


@dataclass(repr=False)
class ComboResult:
    precision: str
    optimizer: str
    recompute: bool
    status: str = "pending"
    max_batch_size: int | None = None
    peak_bytes: int | None = None
    samples_per_second: float | None = None
    probes: int = 0
    reason: str | None = None
    static_bytes: dict[str, int] = field(default_factory=dict)
    bytes_per_sample: float | None = None
    knee_batch_size: int | None = None
    recompute_blocks: dict[str, int] = field(default_factory=dict)  # {"Block": 12}: what recomputation wraps
    trace: list[ProbeRecord] = field(default_factory=list)
    seq_len: int | None = None  # tokens per sample its probes ran at (None: make_batch's one shape)
    #: The recomputation level (autobatch.core.levels: off, full, selective, K/N); None in results written
    #: before levels (``recompute`` then says off or full)
    recompute_level: str | None = None
    compile: bool = False  # torch.compile in its probes
    compile_seconds: float | None = None  # the compile's own time in its last compiled probe
    plan: list[int] | None = None  # [micro-batch, accumulation steps] of its plan (None: not planned)
    #: Throughput: measured seconds per global batch under ``plan`` (autobatch.core.choice.Timing.global_time)
    global_batch_seconds: float | None = None

    @classmethod
    def of(cls, combo: Combo, **fields: Any) -> ComboResult:
        """The entry of one combination (its precision, optimizer, level, compile and length)."""
        names = {"recompute_level": combo.recompute_level, "compile": combo.compile, "seq_len": combo.seq_len}
        return cls(combo.precision, combo.optimizer, combo.recompute, **{**names, **fields})

    @property
    def ident(self) -> Ident:
        return ident_of(self)

    @property
    def key(self) -> str:
        return self.ident.name

    @property
    def answered(self) -> bool:
        """Whether it has a maximum to plan: searched to the end (``exact``, ``capped``), or ``incomplete``
        with a batch whose confirmation held below every batch that did not fit (a boundary that flickers
        from probe to probe: the largest batch known to hold, never one whose confirmation failed)."""
        return self.max_batch_size is not None and self.status in ANSWERED

    def __repr__(self) -> str:
        """Its answer in a line (its trace holds every probe: pages in a notebook); the fields are all there."""
        said = [self.status]
        if self.max_batch_size is not None:
            said.append(f"max batch {self.max_batch_size}")
        if self.peak_bytes:
            said.append(f"peak {format_bytes(self.peak_bytes)}")
        said.append(_count(self.probes, "probe"))
        if self.reason and not self.answered:
            said.append(
                self.reason if len(self.reason) <= REPR_REASON else self.reason[: REPR_REASON - 3] + "..."
            )
        length = f" at {self.seq_len} tokens" if self.seq_len else ""
        return f"<ComboResult {self.key}{length}: {', '.join(said)}>"


#: The longest reason a combination's repr shows whole.
REPR_REASON = 100


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


@dataclass
class Chosen:
    precision: str
    optimizer: str
    recompute: bool
    micro_batch_size: int
    accumulation_steps: int
    world_size: int
    global_batch_size: int
    requested_global_batch_size: int | None = None
    exact: bool = True
    note: str | None = None
    #: Throughput objective: the winner's rate over the runner-up's, less 1 (None: no runner-up timed),
    #: the runner-up, and how the choice was made (measured margin, or a tie within the noise).
    margin: float | None = None
    runner_up: str | None = None
    decided_by: str | None = None
    strategy: str = "none"  # none | ddp | fsdp: what the maximum was measured with
    nproc_per_node: int = 1
    num_nodes: int = 1
    seq_len: int | None = None  # the length the plan is for (None: make_batch's one shape)
    recompute_level: str | None = None  # as ComboResult's
    compile: bool = False
    #: Environment the answer holds under, which the job must set too (the CPU device: the probes' pinned
    #: allocator, :data:`autobatch.devices.cpu.MALLOC_ENV`); empty: none (CUDA).
    environment: dict[str, str] = field(default_factory=dict)
    #: A script run as it is that accumulates gradients of its own: the micro-batches per optimizer step it
    #: runs by itself (``accumulation_steps`` counts them, times what ``{accum}`` gives it); None: it does not.
    script_accumulation: int | None = None

    @property
    def accumulation_words(self) -> str:
        """``accumulation_steps`` and, when the script accumulates of its own, who does what of it."""
        own = self.script_accumulation
        if not own:
            return str(self.accumulation_steps)
        given = self.accumulation_steps // own
        rest = f" x {given} through {{accum}}" if given > 1 else ""
        return f"{self.accumulation_steps} (the script's own {own}{rest})"

    @property
    def plan_words(self) -> str:
        """``micro-batch 12 x accumulation 2 x world 4 = global 96``: the plan as the command and the API say it."""
        return (
            f"micro-batch {self.micro_batch_size} x accumulation {self.accumulation_words} x world {self.world_size} "
            f"= global {self.global_batch_size}"
        )

    @property
    def ident(self) -> Ident:
        return ident_of(self)

    @classmethod
    def of(cls, entry: ComboResult, plan: Plan, **extra: Any) -> Chosen:
        """The chosen combination ``entry`` with its accumulation ``plan``."""
        return cls(
            precision=entry.precision,
            optimizer=entry.optimizer,
            recompute=entry.recompute,
            recompute_level=entry.recompute_level,
            compile=entry.compile,
            micro_batch_size=plan.micro_batch_size,
            accumulation_steps=plan.accumulation_steps,
            world_size=plan.world_size,
            global_batch_size=plan.global_batch_size,
            requested_global_batch_size=plan.requested_global_batch_size,
            exact=plan.exact,
            note=plan.note,
            seq_len=entry.seq_len,
            **extra,
        )


@dataclass
class Lengths:
    """The answer over sequence lengths (:mod:`autobatch.core.lengths`): every combination's maximum at every
    length (``maxima``: searched, or ``status`` "predicted" from the surface) and, per combination, the fitted
    surface, its fit error and its token budget (``surfaces``)."""

    seq_lens: list[int]  # searched, ascending
    plan_seq_len: int
    line_bytes: int  # the line the maxima are measured against: the budget less the margin
    batch_multiple: int = 1
    maxima: list[ComboResult] = field(default_factory=list)
    surfaces: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Lengths:
        return cls(**{**_known(cls, data), "maxima": [_combo(c) for c in data.get("maxima", [])]})

    def measured(self, ident: Ident) -> tuple[Measured, ...]:
        """What the probes of ``ident`` found at each searched length (predicted rows are not measured): the
        maximum, with its peak, and the smallest batch that ran out of memory (a crash or a timeout says nothing
        about memory)."""
        found = []
        for row in self.maxima:
            if not row.seq_len or row.status == "predicted" or row.ident != ident:
                continue
            fits = row.max_batch_size if row.answered else None
            oom = min((probe.batch_size for probe in row.trace if probe.kind == "oom"), default=None)
            found.append(Measured(int(row.seq_len), fits or 0, row.peak_bytes if fits else None, oom))
        return tuple(found)


@dataclass(repr=False)
class TuneResult:
    script: str
    script_args: list[str]
    device: dict[str, Any]
    objective: str
    combinations: list[ComboResult]
    chosen: Chosen | None = None
    status: str = "complete"
    probes: int = 0
    probe_overhead_seconds: float | None = None
    wall_seconds: float | None = None
    torch_version: str | None = None
    autobatch_version: str | None = None
    created: str | None = None
    notes: list[str] = field(default_factory=list)
    distributed: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    pid: int | None = None
    host: str | None = None
    cache: dict[str, Any] | None = None
    devices: list[dict[str, Any]] | None = None
    as_is: dict[str, Any] | None = None
    lengths: Lengths | None = None
    script_files: dict[str, Any] | None = None

    def __repr__(self) -> str:
        """What a notebook shows of a result, in a line: its status, the chosen plan, the device and its budget, what
        the probes cost, and how many notes (the whole record is pages); every field is still an attribute."""
        ch = self.chosen
        chosen = f"{ch.ident.name} {ch.plan_words}" if ch is not None else "nothing chosen"
        budget = self.device.get("budget_bytes")
        device = str(self.device.get("name", "?")) + (f", budget {format_bytes(budget)}" if budget else "")
        cost = _count(self.probes, "probe") + f" over {_count(len(self.combinations), 'combination')}"
        if (self.cache or {}).get("served"):
            cost += ", served from the cache"
        elif self.wall_seconds is not None:
            cost += f", {self.wall_seconds:.1f} s"
        notes = f"; {_count(len(self.notes), 'note')}" if self.notes else ""
        return f"<TuneResult {self.status}: {chosen}; {device}; {cost}{notes}>"

    def tuned_peak(self, micro_batch_size: int) -> int | None:
        """The chosen combination's measured peak at ``micro_batch_size``, or at the smallest batch above it that
        fitted (an upper bound); None without a chosen combination."""
        chosen = self.chosen
        combo = next((c for c in self.combinations if chosen is not None and c.ident == chosen.ident), None)
        if combo is None:
            return None
        fits = [
            r for r in combo.trace if r.kind == "fits" and r.peak_bytes and r.batch_size >= micro_batch_size
        ]
        return min(fits, key=lambda r: r.batch_size).peak_bytes if fits else combo.peak_bytes

    def in_words(self, door: Door) -> TuneResult:
        """This result (changed in place) with the levers its texts name in the neutral form (a probe's, a
        script's note) named as ``door``'s user writes them (:mod:`autobatch.settings.levers`)."""
        self.notes[:] = [in_words(note, door) for note in self.notes]
        for entry in self.combinations:
            entry.reason = entry.reason and in_words(entry.reason, door)
        if self.chosen is not None:
            self.chosen.note = self.chosen.note and in_words(self.chosen.note, door)
        return self

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in _ABSENT_WHEN_NONE:
            if data.get(name) is None:
                data.pop(name, None)
        for combo in [
            data["chosen"] or {},
            *data["combinations"],
            *(data.get("lengths") or {}).get("maxima", []),
        ]:
            for name in (
                "recompute_blocks",
                "seq_len",
                "compile",
                "compile_seconds",
                "recompute_level",
                "plan",
                "global_batch_seconds",
                "environment",
                "script_accumulation",
            ):  # when set
                if name in combo and not combo.get(name):
                    combo.pop(name, None)
            for record in combo.get("trace", []):
                if record.get("started_at") is None:
                    record.pop("started_at", None)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuneResult:
        combos = [_combo(c) for c in data.get("combinations", [])]
        chosen = Chosen(**_known(Chosen, data["chosen"])) if data.get("chosen") else None
        lengths = Lengths.from_dict(data["lengths"]) if data.get("lengths") else None
        return cls(**{**_known(cls, data), "combinations": combos, "chosen": chosen, "lengths": lengths})

    @classmethod
    def load(cls, path: str | Path) -> TuneResult:
        from autobatch.errors import UsageError
        from autobatch.records.schema import check_result

        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise UsageError(
                f"no result file at {path}", hint="run `autobatch tune` first, or pass the path it wrote"
            ) from None
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(
                f"cannot read result file {path}: {exc}", hint="pass a JSON file written by `autobatch tune`"
            ) from None
        check_result(data, path)
        return cls.from_dict(data)

    def combo(
        self, precision: str, optimizer: str, recompute: bool | str, compile: bool = False
    ) -> ComboResult | None:
        """The entry of one combination (``recompute``: a level, or a bool for off and full)."""
        level = recompute if isinstance(recompute, str) else FULL if recompute else OFF
        return next(
            (c for c in self.combinations if c.ident == Ident(precision, optimizer, level, compile)), None
        )


def _combo(data: dict[str, Any]) -> ComboResult:
    trace = [ProbeRecord(**_known(ProbeRecord, p)) for p in data.get("trace", [])]
    return ComboResult(**{**_known(ComboResult, data), "trace": trace})


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def limited_failure(result: TuneResult, door: Door = "cli") -> ProbeFailure | None:
    """The error that ends a tune some of whose maxima a crash or timeout limited (exit 6), or None.

    Raised by :meth:`Tuner.run` when nothing else could be chosen; otherwise ``tune`` raises it after the
    result, the choice and the emitted files are out (the answer is usable, but not what was asked).
    """
    limited = [c for c in result.combinations if c.status.endswith("-limited")]
    if not limited:
        return None
    lines = [f"{c.key}: {c.reason}" for c in limited]
    return ProbeFailure(
        f"{len(limited)} combination(s) ended on a crash or timeout, not on memory:\n  " + "\n  ".join(lines),
        hint=(
            "run `autobatch check SCRIPT --batch-size N --verbose` at that batch to see the probe's log"
            if door == "cli"
            else "run `autobatch.check(..., batch_size=N)` at that batch: its error's .detail holds the probe's log"
        )
        + f"; a timeout needs a larger {lever(door, 'timeout')}, a crash is a bug in the script or a native library (not memory)",
    )


def nothing_chosen(result: TuneResult, budget_bytes: int, door: Door = "cli") -> AutobatchError:
    """The error of a finished tune that chose nothing: its maxima limited by crashes or timeouts
    (:func:`limited_failure`), else why nothing fits (:func:`nothing_fits`). The tune raises it, and ``emit`` and
    ``lengths`` say it again of the result it wrote."""
    return limited_failure(result, door) or nothing_fits(result, budget_bytes, door)


#: How the tuner skips a combination that recomputes a model without repeated blocks.
NO_BLOCKS = "no repeated blocks to recompute"


def nothing_fits(result: TuneResult, budget_bytes: int, door: Door = "cli") -> AutobatchError:
    """The error of a tune that chose nothing, naming what stopped it: recomputation asked of a model with no
    repeated blocks (every combination skipped, no probe: a broken contract, exit 3), a sequence length at
    which not one sample fits beside static memory, else static memory against the budget (exit 4). Its fixes
    name the levers as ``door`` does."""
    memory = lever(door, "memory")
    entries = result.combinations
    if entries and all(e.status == "skipped" and NO_BLOCKS in (e.reason or "") for e in entries):
        levels = ", ".join(dict.fromkeys(e.recompute_level or "full" for e in entries))
        return NoBlocksError(
            f"recomputation ({levels}) asked for, but the model has no repeated blocks to wrap, and every "
            "combination asked recomputes: nothing was probed",
            hint=f"name the block classes with {lever(door, 'recompute_classes')} (or RECOMPUTE_CLASSES in the "
            f"script), or search without recomputation: {lever(door, 'recompute', 'off')}",
        )
    unheld = [e for e in entries if e.status == "incomplete"]
    if unheld and all(e.status in ("incomplete", "skipped") for e in entries):
        return NothingFitsError(
            f"no batch held a probe as long as a confirmation within the budget of {format_bytes(budget_bytes)}, "
            f"though shorter probes fitted: {unheld[0].key}: {unheld[0].reason}",
            hint="memory grows over the steps (a leak, a cache that fills) or the boundary flickers: "
            f"{'`autobatch check -b N --steps 20`' if door == 'cli' else '`autobatch.check(..., batch_size=N, steps=20)`'}"
            f" shows each step's peak; give it more {memory}",
        )
    searched = [e for e in entries if e.status == "infeasible"]
    long = [e for e in searched if e.seq_len is not None and "tokens per sample" in (e.reason or "")]
    if searched and len(long) == len(searched):
        length = max(e.seq_len or 0 for e in long)
        return NothingFitsError(
            f"no combination fits one sample of {length:,} tokens ({lever(door, 'seq_lens', [length])}) within the budget of "
            f"{format_bytes(budget_bytes)}: {long[0].key}: {long[0].reason}",
            hint="static memory leaves room, the length does not: tune at the lengths the job runs (a shorter "
            f"{lever(door, 'seq_lens')}), or give it more {memory}",
        )
    first = f": {searched[0].key}: {searched[0].reason}" if searched and searched[0].reason else ""
    if entries and all(
        e.precision == SCRIPT_OWN for e in entries
    ):  # a script run as it is: no lever to search
        return NothingFitsError(
            f"the script does not fit even the smallest batch within the budget of {format_bytes(budget_bytes)}"
            f"{first}",
            hint=f"a script run as it is keeps its own precision, optimizer and model: give it more {memory}, or "
            "run it smaller (its arguments, its config: a narrower model, bf16, a lighter optimizer)",
        )
    return NothingFitsError(
        f"no combination fits even the smallest batch within the budget of {format_bytes(budget_bytes)}{first}",
        hint="see each combination's reason (static memory vs budget); try bf16, a lighter optimizer, "
        f"recomputation, or more {memory}",
    )
