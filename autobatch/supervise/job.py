"""One launch of a training job, supervised from outside: its output through, its signals forwarded, its peak
measured, how it ended read.

* **A session of its own.** The job starts with ``start_new_session`` (its process group is its pid), so a
  signal to the group reaches every process it started, and a terminal's Ctrl-C reaches autobatch, which
  forwards it. SIGTERM and SIGINT are forwarded to the group (a scheduler's preemption); a job still alive
  :data:`STOP_GRACE` seconds after a forwarded signal is killed. When the job's first process has ended,
  whatever is left of its group is killed, and so is every process below autobatch (it is the subreaper of
  its descendants: :func:`autobatch.probe.lineage.become_subreaper`), the ones that left the group included.
* **Its output streams through unchanged.** stdout is the job's own; stderr is read and written through byte
  for byte, and its last :data:`TAIL_BYTES` are kept to read the job's traceback.
* **How it ended.** A non-zero exit whose last traceback names an out-of-memory failure, by the rules every
  probe is classified with (:func:`autobatch.probe.oom.explain_traceback`), is an OOM (under torchrun, the
  traceback of the rank it names as the root cause: :func:`root_cause`); so is a SIGKILL
  autobatch did not send when the kernel's OOM killer may have sent it (the cgroup's ``oom_kill`` count rose,
  or cannot be read). A job whose last error is its own guard's :class:`autobatch.errors.GuardError` (a batch
  that ran out of memory one sample at a time, or a micro-batch of 1 that BatchNorm refused) says so in
  :attr:`JobOutcome.guard`, out of memory or not (:func:`guard_error`). Anything else is the job's own end, its
  exit code passed through (128 + N for signal N).
* **Its peak** on the CPU device: the largest data memory of any of its processes, the quantity ``RLIMIT_DATA``
  caps (:mod:`autobatch.devices.cpu`), read from ``/proc/PID/status`` every :data:`SAMPLE_SECONDS` as the
  kernel's high-water mark of the address space (``VmPeak``) less the mappings that are not data at the reading
  where the mark rose (:class:`autobatch.devices.cpu.DataPeak`: a DataLoader's batches are shared mappings that
  come and go, not data). A high-water mark misses nothing between two readings, only what a process grows in
  its last interval before it exits.
  ``--memory`` caps every process of the job with ``RLIMIT_DATA`` at the device's capacity, as a card of that
  size would. On CUDA: the device memory NVML lists for the job's processes on its busiest device, sampled as
  often (:class:`autobatch.devices.cuda.nvml.JobMeter`); it counts each process's CUDA context, which a
  tune's budget leaves out, and a sample can miss a short peak between two readings.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from autobatch.devices.cgroup import oom_kills
from autobatch.devices.cpu import DataPeak, apply_cap, read_status
from autobatch.probe.lineage import become_subreaper, end_descendants
from autobatch.probe.oom import TRACEBACK, explain_traceback

#: Seconds a job may take to end after a forwarded SIGTERM or SIGINT before it is killed.
STOP_GRACE = 30.0
#: The end of the job's stderr kept to read its traceback (bytes).
TAIL_BYTES = 64 << 10
#: Seconds between two readings of the job's memory.
SAMPLE_SECONDS = 0.2
#: torchrun's line for a rank that a signal ended ("Signal 9 (SIGKILL) received by PID 1234").
_RANK_KILLED = "Signal 9 (SIGKILL) received by PID"
#: A rank's line under torchrun.
_RANK_LINE = re.compile(r"\[rank(\d+)\]: ")
#: What a rank says when a peer failed first (gloo's closed connection; an abort on it).
_PEER_FAILED = re.compile(r"Connection closed by peer|remote worker crashing|exitcode\s*:\s*-6 .*SIGABRT")
#: torchrun's report of a failed job, naming the rank that failed first.
_ROOT_CAUSE = re.compile(
    r"ChildFailedError.*?Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)", re.S
)
#: The line Python prints for the guard's error, the last of its traceback (its hint on the next line).
_GUARD_LINE = re.compile(r"^(?:autobatch\.errors\.)?GuardError: (.*)$")
#: How the peak is measured, per device type (recorded with it).
PEAK_HOW = {
    "cpu": "largest VmPeak less non-data mappings of the job's processes, read from /proc every 0.2 s",
    "cuda": "NVML's used memory of the job's processes on its busiest device (CUDA contexts included), "
    "sampled every 0.2 s",
}


@dataclass(frozen=True)
class JobSpec:
    """What to launch: the words, the environment (whole), where, the data-memory cap of every process, and the
    device type whose memory its peak is (``cpu`` or ``cuda``)."""

    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str | None = None
    memory_cap: int | None = None
    device: str = "cpu"


@dataclass(frozen=True)
class GuardGaveUp:
    """The job's guard could not run a batch: its :class:`autobatch.errors.GuardError`, as the job printed it."""

    message: str
    hint: str = ""


@dataclass
class JobOutcome:
    """How a launch ended: ``returncode`` as a shell gives it (128 + N for signal N), ``oom`` the reason when
    it ran out of memory, ``guard`` the job's guard's error when that ended it, ``forwarded`` the signal
    autobatch forwarded to it (None: none)."""

    returncode: int
    oom: str | None = None
    guard: GuardGaveUp | None = None
    forwarded: int | None = None
    peak_bytes: int | None = None
    stderr_tail: str = ""
    seconds: float = 0.0
    pids: set[int] = field(default_factory=set)


Warn = Callable[[int], object]


def launch(spec: JobSpec, budget_bytes: int | None = None, on_peak: Warn | None = None) -> JobOutcome:
    """Run the job to its end (see the module docstring); ``on_peak`` is called with the peak each time it
    grows, from the sampling thread."""
    become_subreaper()
    started = time.monotonic()
    cap = spec.memory_cap
    proc = subprocess.Popen(
        list(spec.argv),
        env=dict(spec.env),
        cwd=spec.cwd,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=(lambda: apply_cap(cap)) if cap else None,  # never above the hard limit it inherits
    )
    assert proc.stderr is not None
    killed_before = oom_kills()
    forwarding = _Forwarding(proc.pid)
    tail: deque[bytes] = deque()
    tee = threading.Thread(target=_tee, args=(proc.stderr.fileno(), tail), daemon=True)
    sampler = _Sampler(proc.pid, on_peak, _meter(spec.device))
    tee.start()
    sampler.start()
    try:
        with forwarding:
            status = _wait(proc.pid)
    finally:
        sampler.stop()
        _end_group(proc.pid)
        end_descendants()
        tee.join(timeout=5.0)
        proc.stderr.close()
        proc.returncode = 0  # reaped by _wait (os.wait4): Popen must not wait for it again
    code = os.waitstatus_to_exitcode(status) if status is not None else 1
    returncode = 128 - code if code < 0 else code
    text = b"".join(tail).decode(errors="replace")
    outcome = JobOutcome(
        returncode,
        forwarded=forwarding.signum,
        peak_bytes=sampler.peak or None,
        stderr_tail=text,
        seconds=time.monotonic() - started,
        pids=sampler.pids,
    )
    if forwarding.signum is None and returncode != 0:
        outcome.oom = _oom_reason(returncode, text, killed_before, sampler.peak or None, budget_bytes)
        outcome.guard = guard_error(root_cause(text) or text)
    return outcome


def guard_error(text: str) -> GuardGaveUp | None:
    """The guard's error when the last traceback in ``text`` ends with it (None: another error, or none).

    Only the last exception counts, the one that ended the job: a ``GuardError`` raised from BatchNorm's
    ``ValueError`` is printed after it, and one the job caught and logged before failing otherwise is not
    its end. ``GuardError``'s text carries its hint on a line of its own, right after its message."""
    lines = text.splitlines()
    start = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].strip() == TRACEBACK), None)
    if start is None:
        return None
    # the frames are indented; the exception's own line is the first one that is not
    at = next((i for i in range(start + 1, len(lines)) if lines[i] and not lines[i][0].isspace()), None)
    found = _GUARD_LINE.match(lines[at].rstrip()) if at is not None else None
    if found is None or at is None:
        return None
    after = lines[at + 1].strip() if at + 1 < len(lines) else ""
    return GuardGaveUp(
        found.group(1).strip(), after.removeprefix("hint:").strip() if after.startswith("hint:") else ""
    )


def _oom_reason(
    returncode: int, text: str, killed_before: int | None, peak: int | None, budget: int | None
) -> str | None:
    cause = root_cause(text)
    # the named rank failed because a peer did (its connection closed, or it aborted on it): a peer's
    # out-of-memory error is the cause, whichever rank torchrun saw exit first
    peers = _rank_texts(text).values() if cause is not None and _PEER_FAILED.search(text) else []
    candidates = [cause or text, *peers]
    for candidate in candidates:
        verdict = explain_traceback(candidate, used_bytes=peak, budget_bytes=budget)
        if verdict is not None and verdict.kind == "oom":
            line = next(
                (
                    ln
                    for ln in reversed(candidate.splitlines())
                    if verdict.rule and _names_rule(ln, verdict.rule)
                ),
                "",
            )
            return line.strip()[:200] or verdict.reason
    if returncode == 128 + signal.SIGKILL or _RANK_KILLED in text:
        after = oom_kills()
        if killed_before is None or after is None:
            return "killed by SIGKILL, which autobatch did not send (the kernel's OOM killer, presumably)"
        if after > killed_before:
            return "killed by the kernel's OOM killer (the cgroup's oom_kill count rose)"
    return None


def root_cause(text: str) -> str | None:
    """The stderr of the rank torchrun names as its job's root cause (None: not a torchrun failure report).

    torchrun ends a failed job with its own ``ChildFailedError`` traceback, the last one on stderr, and names
    the rank that failed first; the other ranks' errors (a peer's closed connection) follow from it. Each
    rank's lines carry torchrun's ``[rankN]:`` prefix; without the prefix, the stderr before torchrun's own
    traceback."""
    found = _ROOT_CAUSE.search(text)
    if found is None:
        return None
    named = _rank_texts(text).get(int(found.group(1)))
    if named is not None:
        return named
    ours = text.rfind("Traceback (most recent call last):", 0, found.start())
    return text[:ours] if ours > 0 else None


def _rank_texts(text: str) -> dict[int, str]:
    """Each rank's stderr lines by rank number, torchrun's ``[rankN]:`` prefix taken off."""
    found: dict[int, list[str]] = {}
    for line in text.splitlines():
        if (match := _RANK_LINE.match(line)) is not None:
            found.setdefault(int(match.group(1)), []).append(line[match.end() :])
    return {rank: "\n".join(lines) for rank, lines in found.items()}


def _names_rule(line: str, rule: str) -> bool:
    from autobatch.probe.oom import RULES

    found = next((r for r in RULES if r.name == rule), None)
    if found is None:
        return False
    if found.pattern is not None:
        return bool(found.pattern.search(line))
    return any(name in line for name in found.types)


def _wait(pid: int) -> int | None:
    """Wait for the job's first process (a signal handler runs meanwhile: PEP 475 resumes the wait)."""
    try:
        _, status, _ = os.wait4(pid, 0)
        return status
    except ChildProcessError:
        return None


class _Forwarding:
    """While entered: SIGTERM and SIGINT go to the job's process group; the job is killed if it outlives a
    forwarded signal by :data:`STOP_GRACE` seconds."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self.signum: int | None = None
        self._previous: dict[int, object] = {}
        self._timer: threading.Timer | None = None

    def __enter__(self) -> _Forwarding:
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._forward)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        if self._timer is not None:
            self._timer.cancel()

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        self.signum = self.signum or signum
        _signal_group(self.pgid, signum)
        if self._timer is None:
            self._timer = threading.Timer(STOP_GRACE, _signal_group, (self.pgid, signal.SIGKILL))
            self._timer.daemon = True
            self._timer.start()


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _end_group(pgid: int) -> None:
    """Kill what is left of the job's process group once its first process has ended."""
    _signal_group(pgid, signal.SIGKILL)


def _tee(fd: int, tail: deque[bytes]) -> None:
    """Copy the job's stderr to ours, byte for byte, keeping its last :data:`TAIL_BYTES`."""
    out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
    kept = 0
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except OSError:
            return
        if not chunk:
            return
        if out is not None:
            try:
                out.write(chunk)
                out.flush()
            except (OSError, ValueError):
                out = None
        else:
            sys.stderr.write(chunk.decode(errors="replace"))
        tail.append(chunk)
        kept += len(chunk)
        while kept - len(tail[0]) >= TAIL_BYTES:
            kept -= len(tail.popleft())


PeakReader = Callable[[set[int]], "int | None"]


def _meter(device: str) -> tuple[PeakReader, Callable[[], None]]:
    """How the job's peak is read on ``device``, and what to close after."""
    if device == "cuda":
        from autobatch.devices.cuda.nvml import JobMeter

        meter = JobMeter()
        return meter.read, meter.close
    return DataPeaks().read, lambda: None


class DataPeaks:
    """The peak data memory of the job's processes, each read as a probe's (:class:`DataPeak`, from the process's
    start): a mark read again at a later sample keeps the mappings of the sample at which it rose."""

    def __init__(self) -> None:
        self.meters: dict[int, DataPeak] = {}

    def read(self, pids: set[int]) -> int | None:
        """The largest peak data memory of these processes (None: none readable)."""
        peaks = []
        for pid in pids:
            try:
                status = read_status(pid)
            except (OSError, ValueError, IndexError, KeyError):  # gone, a zombie, or not readable
                continue
            peaks.append(self.meters.setdefault(pid, DataPeak()).read(status))
        return max(peaks) if peaks else None


class _Sampler(threading.Thread):
    """Reads the memory of every process of the job's process group (and of the job's first process's
    descendants) until stopped, with the device's reader; :attr:`peak` is the largest seen."""

    def __init__(self, pid: int, on_peak: Warn | None, meter: tuple[PeakReader, Callable[[], None]]) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.on_peak = on_peak
        self.reader, self.close = meter
        self.peak = 0
        self.pids: set[int] = set()
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        self.read()
        self.join(timeout=2.0)
        self.close()

    def run(self) -> None:
        while not self._stop_event.wait(SAMPLE_SECONDS):
            self.read()

    def read(self) -> None:
        members = self.members()
        self.pids |= {pid for pid in members if Path(f"/proc/{pid}").exists()}
        peak = self.reader(members)
        if peak is not None and peak > self.peak:
            self.peak = peak
            if self.on_peak is not None:
                self.on_peak(peak)

    def members(self) -> set[int]:
        """The job's processes: its process group's, and the first process's descendants."""
        import psutil

        found = set()
        try:
            found = {p.pid for p in psutil.Process(self.pid).children(recursive=True)} | {self.pid}
        except psutil.Error:
            pass
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and _pgid(int(entry.name)) == self.pid:
                found.add(int(entry.name))
        return found


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None
