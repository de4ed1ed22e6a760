"""Probe requests and outcomes: plain records that cross process boundaries as JSON.

An outcome's ``kind`` is one of:

``fits``     every step completed within the budget (and, on CUDA, without allocator retries)
``oom``      the probe ran out of memory (classified in one place: ``autobatch.probe.oom``)
``error``    the training script raised something that is not an OOM: reported with its traceback (with
             ``compile``, a model that does not compile is an ``error`` whose ``error_type`` is ``CompileError``:
             an answer about the combination, classified in ``autobatch.probe.compile_errors``)
``timeout``  the probe did not finish within its timeout and was killed
``crash``    the probe process died without reporting (a signal, an abort, an illegal access)

A process the tune starts (the probe server, the job's fresh process) gets its start message as a file
(:func:`start_word`), not as JSON on its command line.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Protocol

from autobatch.core.levels import OFF

KINDS = ("fits", "oom", "error", "timeout", "crash")


@dataclass(frozen=True)
class StepConfig:
    """The step a probe builds: one combination at one batch size on one device (``"cpu"`` or ``"cuda:N"``),
    as the run's settings shape it. Built once per request (:func:`autobatch.run.session.step_config`) and
    passed on whole: the worker runs it (:func:`autobatch.step.loop.run_steps`), explain's simulation
    replaces only what its scenario changes."""

    batch_size: int
    precision: str
    optimizer: str
    level: str = OFF  # the recomputation level: off, full, selective or K/N (autobatch.step.recompute)
    device: str = "cpu"
    optimizer_kwargs: dict[str, Any] = field(default_factory=dict)
    recompute_classes: tuple[str, ...] = ()  # empty: the script's RECOMPUTE_CLASSES, else detected
    check_batch_size: bool = True  # every batch tensor's leading dimension must be batch_size (step.contract)
    seq_len: int | None = None  # make_batch(batch_size, seq_len); None: make_batch(batch_size), one shape
    # torch.compile the model in the probe (autobatch.step.compiling; never under fake tensors); a model that
    # does not compile is an "error" outcome with error_type "CompileError" (autobatch.probe.compile_errors)
    compile: bool = False

    @property
    def recompute(self) -> bool:
        """Anything recomputed (``level`` says how much)."""
        return self.level != OFF

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepConfig:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["recompute_classes"] = tuple(values.get("recompute_classes", ()))
        return cls(**values)


@dataclass(frozen=True)
class RunConfig:
    """How the run holds a probe: the device's budget and per-process limit, the job's fresh-process offsets,
    the timeout, and the distributed strategy with its ranks. Built once per request from the session's device
    and settings (:func:`autobatch.run.session.run_config`) and passed on whole."""

    budget_bytes: int
    timeout: float  # seconds before the probe is killed
    process_limit_bytes: int | None = None  # CUDA: all the process may hold, per NVML; None: unknown
    strategy: str = "none"  # "none" (one process), "ddp" or "fsdp": see autobatch.probe.ranks
    nproc_per_node: int = 1  # rank processes of a distributed probe
    # CPU device: how much more data memory the job's fresh process of each rank holds than a forked probe
    # process at the same step (autobatch.probe.fresh; entry r for rank r, entry 0 without a strategy; empty:
    # not measured). The probe's cap is lowered and its readings raised by it (autobatch.devices.cpu.CpuBackend),
    # so that peaks are the job's.
    fresh_offset_bytes: tuple[int, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        return cls(**{**values, "fresh_offset_bytes": tuple(values.get("fresh_offset_bytes", ()))})


@dataclass(frozen=True)
class ProbeRequest:
    """One operation for the probe server: the step (:class:`StepConfig`), how the run holds it
    (:class:`RunConfig`), and how long to run and measure it."""

    step: StepConfig
    run: RunConfig
    min_steps: int  # full steps at least (0 for operations that run none, such as inspect)
    max_steps: int  # steps at most, while the peak still grows
    op: str = "probe"  # "probe", "inspect", or another operation registered in autobatch.probe.ops
    options: dict[str, Any] = field(default_factory=dict)  # the operation's options record, as a dict
    # A search's line (budget less the margin, one process only): a peak above it already means "does not
    # fit", so the probe stops at the step that crosses it; None (check, timing, ranks): every step runs.
    stop_above_bytes: int | None = None
    #: A timing probe: it measures step times for the throughput choice, not a maximum (under the same cap and
    #: allocator as the search's probes, as the job runs; the journal keeps it apart from a search's probe).
    timing: bool = False

    @property
    def batch_size(self) -> int:
        return self.step.batch_size

    @property
    def device(self) -> str:
        return self.step.device

    @property
    def budget_bytes(self) -> int:
        return self.run.budget_bytes

    @property
    def timeout(self) -> float:
        return self.run.timeout

    @property
    def process_limit_bytes(self) -> int | None:
        return self.run.process_limit_bytes

    @property
    def strategy(self) -> str:
        return self.run.strategy

    @property
    def nproc_per_node(self) -> int:
        return self.run.nproc_per_node

    def on(self, device: str) -> ProbeRequest:
        """The same request on another device (a rank's)."""
        return replace(self, step=replace(self.step, device=device))

    def on_rank(self, device: str, rank: int) -> ProbeRequest:
        """The request of one rank: on its device, counted with its own fresh-process offset."""
        return replace(self.on(device), run=replace(self.run, fresh_offset_bytes=(self.offset_for(rank),)))

    def with_run(self, **changes: Any) -> ProbeRequest:
        """The same request, held otherwise (``changes``: :class:`RunConfig`'s fields)."""
        return replace(self, run=replace(self.run, **changes))

    def offset_for(self, rank: int = 0) -> int:
        """The fresh-process offset of ``rank`` (0 when none was measured)."""
        offsets = self.run.fresh_offset_bytes
        return offsets[rank] if rank < len(offsets) else 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeRequest:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        return cls(
            **{**values, "step": StepConfig.from_dict(data["step"]), "run": RunConfig.from_dict(data["run"])}
        )


@dataclass
class ProbeOutcome:
    kind: str
    batch_size: int = 0
    peak_bytes: int | None = None
    step_peaks: list[int] = field(default_factory=list)
    baseline_bytes: int | None = None
    budget_bytes: int | None = None
    steps: int = 0
    step_seconds: list[float] = field(default_factory=list)
    #: per step, the seconds of its update (optimizer step, zero_grad), part of ``step_seconds``
    update_seconds: list[float] = field(default_factory=list)
    samples_per_second: float | None = None
    param_count: int = 0
    param_bytes: int = 0
    grad_bytes: int = 0
    optimizer_state_bytes: int = 0
    recompute_blocks: list[str] = field(default_factory=list)
    device_stats: dict[str, Any] = field(default_factory=dict)
    error_type: str | None = None
    error_message: str | None = None
    traceback: str | None = None
    contract: bool = False  # the error is a broken contract (wrong return type, ...)
    reason: str | None = None
    log_tail: str | None = None
    wall_seconds: float = 0.0
    setup_seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)  # "inspect" answers
    cached: bool = False  # replayed from the probe cache, not run now
    first_backward_peak_bytes: int | None = None  # the peak when the first backward ended
    rank_peak_bytes: list[int] = field(
        default_factory=list
    )  # distributed: every rank's peak (peak_bytes: the largest)
    failed_rank: int | None = None  # distributed: the rank whose failure ended the probe
    started_at: float | None = None  # when the probe started (seconds since the epoch; set by the session)
    stopped_above_bytes: int | None = None  # the request's stop line, when the probe stopped at it
    # CPU device: how long the probe's threads waited for a core while it ran, over its wall time (None:
    # unknown; on a CUDA device a GPU shared with another process would not show here: not measured)
    cpu_wait: float | None = None
    # OMP_WAIT_POLICY in the probe's environment (None: OpenMP's default, threads that spin while they wait):
    # step times are compared only under the same one (autobatch.probe.yielding)
    omp_wait_policy: str | None = None
    # the distinct shapes of the batches make_batch returned, one per step, when they differed (empty: one shape)
    batch_shapes: list[str] = field(default_factory=list)
    # with compile: the seconds the compiler took (first step, recompilations), left out of step_seconds and of
    # samples_per_second; None: not compiled
    compile_seconds: float | None = None
    # a script's files (autobatch.probe.files): path -> fingerprint of every file it read (the probe reports None,
    # the session fills it in: autobatch.cache.sources.file_fingerprint), and every path it tried to write, in
    # order; relative to the working folder when inside it, else absolute
    files_read: dict[str, str | None] = field(default_factory=dict)
    files_written: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.kind == "fits"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeOutcome:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class ProbeRunner(Protocol):
    """What a session runs its operations on: the probe server (:class:`autobatch.probe.client.ProbeClient`),
    or a fake one (:class:`autobatch.testing.FakeRunner`) that answers without torch."""

    torch_version: str

    def run(self, request: ProbeRequest) -> ProbeOutcome:
        """Run one operation in a fresh, isolated process and describe what happened."""
        ...

    def close(self) -> None:
        """Stop every process the runner started; safe to call more than once."""
        ...


def start_word(message: dict[str, Any], folder: str) -> str:
    """The command-line word that hands ``message`` to a Python the tune starts (``python -m MODULE WORD``): the
    path of a private JSON file in ``folder`` holding it, read by :func:`read_start_word`. Not the JSON itself:
    Linux refuses one argument above 128 KiB (``E2BIG``), and the script's arguments it carries can be longer
    (a job's thousands of data files)."""
    fd, path = tempfile.mkstemp(prefix="start-", suffix=".json", dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        json.dump(message, file)
    return path


def read_start_word(word: str) -> dict[str, Any]:
    """The start message :func:`start_word` handed to this process."""
    with open(word, encoding="utf-8") as file:
        message: dict[str, Any] = json.load(file)
    return message
