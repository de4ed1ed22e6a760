"""An independent fresh-process harness: does a batch size fit a job started as a job starts?

Written without autobatch's code, to check its answers from outside. A trial runs a training script written
to autobatch's contract (``build_model()``, ``make_batch(batch_size)``, ``compute_loss(model, batch)``;
script arguments in ``sys.argv``) the way a real job under the same cap runs it: a fresh ``python``
process whose data memory is capped with ``RLIMIT_DATA`` before ``exec`` (so the interpreter, torch and
the script's imports count against the cap), glibc's malloc pinned as autobatch pins it
(``MALLOC_ARENA_MAX=1``, ``MALLOC_MMAP_THRESHOLD_=65536``), fp32, ``torch.optim.AdamW`` with torch's
defaults, and per step: a new batch (the previous one dropped first), forward and loss, backward,
``optimizer.step()``, ``zero_grad(set_to_none=True)``.

The distributed variant starts ``world`` such processes as ``torchrun --standalone --nproc-per-node world``
starts its workers: the same environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT`` of a TCP store the launcher hosts, ``TORCHELASTIC_USE_AGENT_STORE=True`` so
no rank hosts it, ``OMP_NUM_THREADS=1`` unless set), each rank capped on its own, joining a ``gloo`` group
from the environment and wrapping the model in ``DistributedDataParallel`` with its defaults.

A trial's verdict is one of ``fits`` (every step ran), ``oom`` (the process ran out of memory: a
``MemoryError`` or an allocation error from torch, or a native abort that says so) or ``error``
(anything else, which :func:`fits` raises as :class:`HarnessError`).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

#: glibc's malloc as autobatch pins it on the CPU device (set in the job's environment before it starts).
MALLOC_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
#: Exit codes of a trial process.
EXIT_FITS, EXIT_OOM, EXIT_ERROR = 0, 3, 4
#: What an out-of-memory failure says: torch's CPU allocator, Python, C++ and threads that could not start.
OOM_MARKS = (
    "can't allocate memory",
    "cannot allocate memory",
    "out of memory",
    "bad_alloc",
    "thread creation failed",
    "unable to allocate",
    # oneDNN's way of saying its scratchpad could not be allocated under the cap (vit_small at one batch past its
    # maximum under 768 MiB, once); autobatch reads it as out of memory near the budget, the harness at a cap
    "could not create a primitive",
)
Kind = Literal["fits", "oom", "error"]
TrialT = TypeVar("TrialT")
PR_SET_PDEATHSIG = 1

#: What every trial process starts with: the constants, ``vm("VmData", ...)`` read from /proc, and ``PEAK``, the
#: data high-water mark read as autobatch reads a probe's (``PEAK.read()`` at each optimizer step and at the end).
#: Written here again, not imported: the harness runs no autobatch code, so that its verdict is the job's process
#: alone (importing ``autobatch.devices.cpu`` after torch adds 0.8 MiB of data under the cap) and its figures
#: check autobatch's from outside. The reading, as ``DataPeak`` and ``Ballast`` there: ``VmPeak`` is the high-water
#: mark of the whole address space, and with DataLoader workers the batches they send are shared mappings (not
#: data, not under ``RLIMIT_DATA``), one to three at a time; each mark is read with the mappings of the reading at
#: which it rose (read at the end alone, a mark set under three batches counted two of them as data), and an
#: address-space ballast without memory (``PROT_NONE``) holds the mappings at the mark's level between readings,
#: so that a later rise of the data smaller than the batches no longer mapped still lifts the mark.
CHILD_PRELUDE = (
    (f"OOM_MARKS = {OOM_MARKS!r}\nEXIT_FITS, EXIT_OOM, EXIT_ERROR = {EXIT_FITS}, {EXIT_OOM}, {EXIT_ERROR}\n")
    + r"""
import mmap as _mmap
import resource as _resource


def vm(*keys):
    found = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in keys:
                found[key] = int(rest.split()[0]) * 1024
    return [found[key] for key in keys]


class _Peak:
    def __init__(self):
        self.mark = self.mark_not_data = self.high = 0
        self.ballast, self.ballast_size = None, 0
        self.ballasted = _resource.getrlimit(_resource.RLIMIT_AS)[0] == _resource.RLIM_INFINITY

    def read(self):
        data, size, peak = vm("VmData", "VmSize", "VmPeak")
        if peak > self.mark:
            self.high = max(self.high, peak - (size - data))
            self.mark, self.mark_not_data = peak, size - data
        self.high = max(self.high, data)
        if self.ballasted:
            self.hold(self.mark_not_data - (size - data - self.ballast_size))
        return self.high

    def hold(self, size):
        size = -(-max(0, size) // _mmap.PAGESIZE) * _mmap.PAGESIZE
        if size == self.ballast_size:
            return
        if self.ballast is not None:
            self.ballast.close()
        self.ballast, self.ballast_size = None, 0
        if size:
            try:
                self.ballast = _mmap.mmap(-1, size, flags=_mmap.MAP_PRIVATE | _mmap.MAP_ANONYMOUS, prot=0)
            except OSError:
                return
            self.ballast_size = size


PEAK = _Peak()
"""
)
#: The trial process: ``python -c CHILD REPORT_PATH SCRIPT BATCH STEPS DDP [SCRIPT_ARGS...]``.
CHILD = (
    CHILD_PRELUDE
    + r"""
import importlib.util, json, os, sys, traceback

report_path, script, batch_size, steps, ddp = sys.argv[1:6]
batch_size, steps, ddp = int(batch_size), int(steps), ddp == "1"
sys.argv = [script, *sys.argv[6:]]
report = {"steps": 0}


def finish(kind, code):
    report["kind"] = kind
    report["peak_estimate"] = PEAK.read()
    report["vm_data_end"] = vm("VmData")[0]
    with open(report_path, "w") as handle:
        json.dump(report, handle)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


try:
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    spec = importlib.util.spec_from_file_location("fresh_job_script", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    report["baseline_bytes"] = vm("VmData")[0]  # after import torch and the script, before any tensor
    if ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
    model = module.build_model()
    model.train()
    if ddp:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    batch = None
    for _ in range(steps):
        batch = None  # never two batches at once
        batch = module.make_batch(batch_size)
        loss = module.compute_loss(model, batch)
        loss.backward()
        optimizer.step()
        PEAK.read()
        optimizer.zero_grad(set_to_none=True)
        report["steps"] += 1
    if ddp:
        dist.destroy_process_group()
except BaseException as exc:
    text = f"{type(exc).__name__}: {exc}"
    report["error"] = text[:2000]
    traceback.print_exc()
    oom = isinstance(exc, MemoryError) or any(mark in text.lower() for mark in OOM_MARKS)
    finish("oom" if oom else "error", EXIT_OOM if oom else EXIT_ERROR)
finish("fits", EXIT_FITS)
"""
)


class HarnessError(Exception):
    """A trial failed for a reason other than memory (a broken script, a crash, a timeout)."""


@dataclass(frozen=True)
class Trial:
    """One trial's outcome: ``kind``, the steps that ran and the figures the process reported (``ranks``:
    each rank's own trial, in a distributed one)."""

    kind: Kind
    batch_size: int
    budget_bytes: int
    seconds: float
    steps: int = 0
    baseline_bytes: int | None = None  # VmData after import torch and the script
    vm_data_end: int | None = None
    detail: str = ""
    ranks: list[Trial] = field(default_factory=list)
    #: The data high-water mark, read at every optimizer step and at the end as autobatch reads a probe's (``PEAK``).
    peak_estimate: int | None = None


def run_trial(
    script: str | Path,
    args: list[str] | tuple[str, ...],
    batch: int,
    budget_bytes: int,
    steps: int = 10,
    *,
    timeout: float = 1800.0,
) -> Trial:
    """Run ``steps`` steps of ``script`` at ``batch`` in one fresh process capped at ``budget_bytes``."""

    def command(report: Path) -> list[str]:
        return _command(report, script, args, batch, steps)

    def read(report: Path, logs: Path, code: int, seconds: float) -> Trial:
        return _read(report, logs, code, batch, budget_bytes, seconds)

    return run_child(command, read, budget_bytes, timeout, f"batch {batch}")


def run_child(
    command: Callable[[Path], list[str]],
    read: Callable[[Path, Path, int, float], TrialT],
    budget_bytes: int,
    timeout: float,
    what: str,
) -> TrialT:
    """One trial process capped at ``budget_bytes`` (``command``: its argv, given its report file), read by
    ``read(report, log, exit code, seconds)``; killed, and ``what`` named, after ``timeout`` seconds."""
    with tempfile.TemporaryDirectory(prefix="fresh-trial-") as folder:
        started = time.perf_counter()
        report, logs = Path(folder, "report.json"), Path(folder, "log.txt")
        with open(logs, "wb") as log:
            process = _start(command(report), job_env(), budget_bytes, log)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise HarnessError(f"{what}: no verdict within {timeout:.0f} s") from None
        return read(report, logs, process.returncode, time.perf_counter() - started)


def fits(
    script: str | Path, args: list[str] | tuple[str, ...], batch: int, budget_bytes: int, steps: int = 10
) -> bool:
    """Whether ``steps`` steps at ``batch`` run in a fresh process capped at ``budget_bytes`` (raises
    :class:`HarnessError` on a failure that is not out of memory)."""
    return _verdict(run_trial(script, args, batch, budget_bytes, steps))


def largest_fitting(
    script: str | Path,
    args: list[str] | tuple[str, ...],
    budget_bytes: int,
    lo: int,
    hi: int,
    steps: int = 10,
) -> int:
    """The largest batch in ``[lo, hi]`` that fits (:func:`bisect`)."""
    return bisect(lo, hi, lambda batch: fits(script, args, batch, budget_bytes, steps))


def bisect(lo: int, hi: int, fits_at: Callable[[int], bool]) -> int:
    """The largest batch in ``[lo, hi]`` that ``fits_at``, by bisection (fitting is assumed monotone in the
    batch size); ``lo - 1`` when none does. About ``log2(hi - lo + 2)`` trials: give a tight bracket."""
    good, bad = lo - 1, hi + 1
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits_at(mid):
            good = mid
        else:
            bad = mid
    return good


def run_ddp_trial(
    script: str | Path,
    args: list[str] | tuple[str, ...],
    batch: int,
    budget_bytes: int,
    world: int = 2,
    steps: int = 10,
    *,
    timeout: float = 1800.0,
    grace: float = 3.0,
) -> Trial:
    """Run ``steps`` DDP steps at ``batch`` per rank on ``world`` fresh rank processes, each capped at
    ``budget_bytes``, started as torchrun starts them. When a rank fails, the others get ``grace`` seconds
    to fail too (a peer of a rank that ran out of memory fails in the collective they share), then every
    rank still running is killed."""
    from torch.distributed import TCPStore  # the launcher's store, as torchrun's agent hosts it

    store = TCPStore("127.0.0.1", 0, world, True, wait_for_workers=False)
    run_id = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="fresh-ddp-") as folder:
        started = time.perf_counter()
        processes: list[subprocess.Popen[bytes]] = []
        paths = [(Path(folder, f"report{r}.json"), Path(folder, f"log{r}.txt")) for r in range(world)]
        try:
            for rank, (report, logs) in enumerate(paths):
                env = {**job_env(), **torchrun_env(rank, world, store.port, run_id)}
                with open(logs, "wb") as log:
                    command = _command(report, script, args, batch, steps, ddp=True)
                    processes.append(_start(command, env, budget_bytes, log))
            _wait_ranks(processes, started + timeout, grace)
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                process.wait()
            del store
        seconds = time.perf_counter() - started
        ranks = [
            _read(report, logs, process.returncode, batch, budget_bytes, seconds)
            for (report, logs), process in zip(paths, processes)
        ]
    kinds = {r.kind for r in ranks}
    kind: Kind = "oom" if "oom" in kinds else "error" if "error" in kinds else "fits"
    detail = "; ".join(f"rank {i}: {r.detail}" for i, r in enumerate(ranks) if r.kind != "fits")
    return Trial(
        kind, batch, budget_bytes, seconds, min(r.steps for r in ranks), ranks[0].baseline_bytes,
        ranks[0].vm_data_end, detail, ranks=ranks,
        peak_estimate=max((r.peak_estimate or 0 for r in ranks), default=None),
    )  # fmt: skip


def fits_ddp(
    script: str | Path,
    args: list[str] | tuple[str, ...],
    batch: int,
    budget_bytes: int,
    world: int = 2,
    steps: int = 10,
) -> bool:
    """Whether ``steps`` DDP steps at ``batch`` per rank run on every one of ``world`` fresh rank processes
    (raises :class:`HarnessError` on a failure that is not out of memory)."""
    return _verdict(run_ddp_trial(script, args, batch, budget_bytes, world, steps))


def job_env() -> dict[str, str]:
    """The job's environment: this process's, with glibc's malloc pinned."""
    return {**os.environ, **MALLOC_ENV}


def torchrun_env(rank: int, world: int, port: int, run_id: str) -> dict[str, str]:
    """What ``torchrun --standalone --nproc-per-node world`` puts in worker ``rank``'s environment
    (torch/distributed/elastic/agent/server/local_elastic_agent.py, and run.py for OMP_NUM_THREADS)."""
    env = {
        "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
        "ROLE_NAME": "default", "LOCAL_WORLD_SIZE": str(world), "WORLD_SIZE": str(world),
        "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }  # fmt: skip
    if world > 1:
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    return env


def _command(
    report: Path, script: str | Path, args: Any, batch: int, steps: int, *, ddp: bool = False
) -> list[str]:
    python = [sys.executable, "-u"] if ddp else [sys.executable]  # torchrun runs its workers with -u
    fields = [str(report), str(Path(script).resolve()), str(batch), str(steps), str(int(ddp))]
    return [*python, "-c", CHILD, *fields, *args]


def _start(command: list[str], env: dict[str, str], budget_bytes: int, log: Any) -> subprocess.Popen[bytes]:
    """Start a trial process capped at ``budget_bytes`` from before ``exec`` (it dies with this process)."""

    prctl = ctypes.CDLL(None).prctl  # looked up before the fork: the child only calls it

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (budget_bytes, budget_bytes))
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # no trial outlives the harness

    return subprocess.Popen(
        command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=cap
    )


def _wait_ranks(processes: list[subprocess.Popen[bytes]], deadline: float, grace: float) -> None:
    """Wait until every rank exited, or one failed and the others had ``grace`` seconds (the caller kills
    whoever is left); raise at the deadline."""
    failed_at: float | None = None
    while any(p.poll() is None for p in processes):
        now = time.perf_counter()
        if failed_at is None and any(p.returncode not in (None, 0) for p in processes):
            failed_at = now
        if failed_at is not None and now - failed_at > grace:
            return
        if now > deadline:
            raise HarnessError("the ranks gave no verdict in time; every rank was killed")
        time.sleep(0.05)


def _read(report: Path, logs: Path, code: int, batch: int, budget_bytes: int, seconds: float) -> Trial:
    """A trial process's outcome from its report, or, without one, from its exit and its output."""
    data, tail = read_report(report, logs, code)
    kind = data["kind"]
    if "no_report" in data:
        return Trial(kind, batch, budget_bytes, seconds, detail=data["no_report"])
    detail = data.get("error", "") if kind == "fits" else f"{data.get('error', '')}\n{tail[-1500:]}"
    return Trial(
        kind, batch, budget_bytes, seconds, data.get("steps", 0), data.get("baseline_bytes"),
        data.get("vm_data_end"), detail.strip(), peak_estimate=data.get("peak_estimate"),
    )  # fmt: skip


def read_report(report: Path, logs: Path, code: int) -> tuple[dict[str, Any], str]:
    """A trial process's report and the end of its output; without a report (killed, or a native abort before
    Python could write one), its ``kind`` and a ``no_report`` detail from its exit and its output."""
    tail = logs.read_text(errors="replace")[-4000:]
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        data = {}
    if data.get("kind") is None:
        how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        oom = any(mark in tail.lower() for mark in OOM_MARKS)
        data = {
            "kind": "oom" if oom else "error",
            "no_report": f"{how} without a report; output ends: {tail[-600:]}",
        }
    return data, tail


def _verdict(trial: Trial) -> bool:
    if trial.kind == "error":
        raise HarnessError(f"batch {trial.batch_size}: {trial.detail}")
    return trial.kind == "fits"
