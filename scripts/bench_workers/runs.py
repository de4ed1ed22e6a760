"""The benchmark harness's runners: every method in its own fresh process, timed from the outside.

* :func:`tune` runs ``autobatch tune ... --json`` (one combination, or the default grid).
* :class:`Checker` runs ``autobatch check ... --steps 10`` in a fresh process per batch size and
  remembers each verdict; :func:`true_maximum` bisects with it for the true maximum.
* :func:`worker` runs a ``bench_workers`` module (Lightning, accelerate, build cost) under the pinned
  allocator and reads its record.
* :func:`probe_baseline` and :func:`probe_overhead` talk to autobatch's probe server directly.

Every command runs in a scratch folder with no ``AUTOBATCH_*`` variables, so that no ``autobatch.toml``
or environment setting changes what is measured, and with autobatch's probe cache off.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common import MALLOC_ENV

SCRIPTS_DIR = Path(__file__).resolve().parent.parent
CHECK_STEPS = 10
LARGEST = 65536  # autobatch's default max_batch_size: the bisection gives up above it


@dataclass(frozen=True)
class Workload:
    name: str
    script: Path
    args: tuple[str, ...] = ()
    memory: int = 1 << 30  # the capacity given to autobatch as --memory (bytes)
    levels: bool = False  # repeated blocks worth the recomputation levels (the autobatch-levels method)


@dataclass(frozen=True)
class Setup:
    """What every method of one workload shares."""

    workload: Workload
    memory: int
    headroom: float
    scratch: Path
    timeout: float

    @property
    def budget(self) -> int:
        return int(self.memory * (1 - self.headroom))  # autobatch's own formula (session.py)

    def cap_flags(self) -> list[str]:
        return ["--device", "cpu", "--memory", str(self.memory), "--headroom", str(self.headroom)]


@dataclass
class Run:
    """One process: its wall time, its parsed output, and how it ended."""

    wall: float
    returncode: int | None
    data: dict[str, Any] | None = None
    error: str | None = None


def _env(extra: dict[str, str] | None = None, lock_dir: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOBATCH_")}
    env.update(NO_COLOR="1", COLUMNS="200", **(extra or {}))
    if lock_dir is not None:  # the benchmark's own device lock: another user's tune is no wait in its wall
        env["AUTOBATCH_LOCK_DIR"] = str(lock_dir)
    return env


def _run(cmd: list[str], cwd: Path, timeout: float, env: dict[str, str]) -> tuple[Run, str, str]:
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Run(time.perf_counter() - started, None, error=f"timed out after {timeout:.0f} s"), "", ""
    return Run(time.perf_counter() - started, proc.returncode), proc.stdout, proc.stderr


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def autobatch_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "autobatch", *args]


def daemon(folder: Path, action: str) -> None:
    """``autobatch daemon start`` or ``stop`` for the daemon of ``folder`` (the benchmark's own)."""
    env = _env({"AUTOBATCH_DAEMON": "on", "AUTOBATCH_DAEMON_DIR": str(folder)})
    subprocess.run(autobatch_cmd("daemon", action), env=env, capture_output=True, check=action == "start")


def tune(
    setup: Setup, *, single: bool, flags: tuple[str, ...] = (), name: str = "", daemon: Path | None = None
) -> Run:
    """``autobatch tune`` on the workload: one combination (32-true/adamw/no-recompute), the default grid, or
    with ``flags`` of its own (``name`` its output's); ``daemon``: through the daemon of that folder (running)."""
    w = setup.workload
    single_flags = ["--precision", "32-true", "--optimizer", "adamw", "--no-recompute"]
    chosen = list(flags) if flags else single_flags if single else []
    out = setup.scratch / f"tune-{name or ('single' if single else 'grid')}.json"
    cmd = autobatch_cmd(
        "tune", str(w.script), *setup.cap_flags(), *chosen, "--no-cache", "--json", "--output", str(out)
    )
    cmd += ["--", *w.args] if w.args else []
    through = {"AUTOBATCH_DAEMON": "on", "AUTOBATCH_DAEMON_DIR": str(daemon)} if daemon is not None else None
    run, stdout, stderr = _run(cmd, setup.scratch, setup.timeout, _env(through, lock_dir=setup.scratch))
    if run.returncode == 0:
        run.data = json.loads(stdout)
    elif run.error is None:
        run.error = f"exit {run.returncode}: {_tail(stderr)}"
    return run


@dataclass
class Checker:
    """Fresh-process 10-step verdicts at the workload's cap (32-true, adamw), remembered per batch size.

    ``cli``: one ``autobatch check --steps 10 --json`` process per batch size. ``client``: the same probe
    (what ``check`` runs) sent to one autobatch probe server kept open for the workload, which forks a
    fresh process for it, without the command's start-up (about 4 s) each time. Use as a context manager.
    """

    setup: Setup
    mode: str = "client"  # "client" | "cli"
    verdicts: dict[int, bool] = field(default_factory=dict)  # the first verdict at each size
    history: dict[int, list[bool]] = field(default_factory=dict)  # every verdict at each size
    status_mismatches: list[str] = field(default_factory=list)
    marginal: set[int] = field(default_factory=set)  # fitted the cap, by less than the margin
    cap_history: dict[int, list[bool]] = field(default_factory=dict)  # every verdict of the cap alone
    step_peaks: list[list[int]] = field(default_factory=list)  # each fitting check's peak after every step
    seconds: float = 0.0
    _client: Any = None

    def __enter__(self) -> Checker:
        if self.mode == "client":
            self._client = _client(self.setup.workload)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._client is not None:
            self._client.close()

    def fits(self, batch_size: int) -> bool:
        if batch_size not in self.verdicts:
            self.verdicts[batch_size] = self.fits_again(batch_size)
        return self.verdicts[batch_size]

    def fits_again(self, batch_size: int) -> bool:
        """A new fresh-process check, whatever an earlier one said (to see whether a verdict repeats)."""
        started = time.perf_counter()
        check = self._via_client if self.mode == "client" else self._via_cli
        fits = check(batch_size)
        self.seconds += time.perf_counter() - started
        self.history.setdefault(batch_size, []).append(fits)
        return fits

    def holds_under_cap(self, batch_size: int) -> bool:
        """Whether every check at this size ran its 10 steps under the cap (no OOM; the margin aside)."""
        self.fits(batch_size)
        return all(self.cap_history[batch_size])

    def always_fits(self, batch_size: int) -> bool:
        """Whether every check run at this size so far fitted (running one if none has)."""
        self.fits(batch_size)
        return all(self.history[batch_size])

    def _via_client(self, batch_size: int) -> bool:
        from autobatch.devices.budget import DeviceInfo, apply_margin

        outcome = self._client.run(_request(batch_size, self.setup.budget, CHECK_STEPS))
        if outcome.kind not in ("fits", "oom"):
            raise RuntimeError(
                f"check at batch {batch_size}: {outcome.kind}: {outcome.error_message or outcome.reason}"
            )
        # A fit whose peak comes within the CPU margin of the cap (3 MiB here) does not reproduce
        # reliably in another process: it counts as no fit, as in tune's own search.
        device = DeviceInfo("cpu", "cpu", self.setup.budget, self.setup.budget, 0.0, "VmData")
        self.cap_history.setdefault(batch_size, []).append(outcome.kind == "fits")
        if outcome.kind == "fits" and outcome.step_peaks:
            self.step_peaks.append(list(outcome.step_peaks))
        if apply_margin(outcome, device):
            self.marginal.add(batch_size)
        return bool(outcome.kind == "fits")

    def _via_cli(self, batch_size: int) -> bool:
        w = self.setup.workload
        cmd = autobatch_cmd(
            "check", str(w.script), *self.setup.cap_flags(), "--precision", "32-true",
            "--optimizer", "adamw", "--no-recompute", "--batch-size", str(batch_size),
            "--steps", str(CHECK_STEPS), "--json",
        )  # fmt: skip
        cmd += ["--", *w.args] if w.args else []
        run, stdout, stderr = _run(
            cmd, self.setup.scratch, self.setup.timeout, _env(lock_dir=self.setup.scratch)
        )
        try:
            verdict = json.loads(stdout) if run.returncode in (0, 5) else {}
        except ValueError:
            verdict = {}
        # Read the verdict from the JSON, and note when the exit status (documented: 0 fits, 5 OOM) disagrees.
        if verdict.get("kind") not in ("fits", "oom"):
            raise RuntimeError(
                f"check at batch {batch_size}: {run.error or f'exit {run.returncode}'}: {_tail(stderr)}"
            )
        fits = verdict["kind"] == "fits"
        if (run.returncode == 0) != fits:
            self.status_mismatches.append(f"batch {batch_size}: {verdict['kind']} but exit {run.returncode}")
        self.cap_history.setdefault(batch_size, []).append(fits)
        if fits and verdict.get("within_margin"):  # as in _via_client
            self.marginal.add(batch_size)
            return False
        return fits


def true_maximum(checker: Checker, hint: int | None, others: list[int]) -> int | None:
    """Largest b such that b fits and b + 1 does not, in fresh 10-step checks, bracketed from ``hint``.

    The bracket starts at ``hint`` (autobatch's answer) and its neighbour, then tries the other methods'
    answers on the way out, then grows geometrically; feasibility is taken as monotone inside the final
    bracket (autobatch's premise under the pinned allocator), whose both ends are verified. None when
    batch 1 does not fit.
    """
    start = max(1, hint or 1)
    lo: int | None = None
    hi: int | None = None
    if checker.fits(start):
        lo = start
        for candidate in [start + 1, *sorted(a for a in set(others) if a > start + 1)]:
            if not checker.fits(candidate):
                hi = candidate
                break
            lo = candidate
        step = max(1, lo // 8)
        while hi is None:
            if lo + step > LARGEST:
                raise RuntimeError(f"batch {lo} still fits: no maximum below {LARGEST}")
            if checker.fits(lo + step):
                lo, step = lo + step, step * 2
            else:
                hi = lo + step
    else:
        hi = start
        for candidate in sorted((a for a in set(others) if a < start), reverse=True):
            if checker.fits(candidate):
                lo = candidate
                break
            hi = candidate
        step = max(1, hi // 8)
        while lo is None:
            candidate = max(1, hi - step)
            if checker.fits(candidate):
                lo = candidate
            elif candidate == 1:
                return None
            else:
                hi, step = candidate, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if checker.fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def stable_maximum(checker: Checker, top: int, repeats: int = 2, limit: int = 8) -> int | None:
    """Step down from the bisection's answer to the largest size that fits in ``repeats`` fresh checks out of
    ``repeats`` (the boundary can flicker by a sample or two at the boundary); None when batch 1 does not."""
    for batch_size in range(top, max(0, top - limit), -1):
        while checker.always_fits(batch_size) and len(checker.history[batch_size]) < repeats:
            checker.fits_again(batch_size)
        if checker.always_fits(batch_size):
            return batch_size
    if top <= limit:
        return None
    raise RuntimeError(f"no size in {top - limit + 1}..{top} fits {repeats} times out of {repeats}")


def worker(setup: Setup, module: str, options: dict[str, Any]) -> Run:
    """Run ``bench_workers.<module>`` in a fresh process at the workload's budget; read its record."""
    w = setup.workload
    out = setup.scratch / f"{module}-{options.get('mode', '')}-{options.get('reference_bytes')}-record.json"
    out.unlink(missing_ok=True)
    request = {
        "script": str(w.script),
        "script_args": list(w.args),
        "budget_bytes": setup.budget,
        "out": str(out),
        "options": options,
    }
    env = _env(
        {**MALLOC_ENV, "PYTHONPATH": os.pathsep.join([str(SCRIPTS_DIR), os.environ.get("PYTHONPATH", "")])}
    )
    run, _, stderr = _run(
        [sys.executable, "-m", f"bench_workers.{module}", json.dumps(request)],
        setup.scratch,
        setup.timeout,
        env,
    )
    if out.exists():
        run.data = json.loads(out.read_text())
    elif run.error is None:
        how = f"exit {run.returncode}"
        if run.returncode is not None and run.returncode < 0:
            how = f"killed by {signal.Signals(-run.returncode).name}"
        run.error = f"{how} without a record" + (f": {_tail(stderr)}" if stderr.strip() else "")
    return run


@dataclass
class Overhead:
    batch_size: int
    server_start: float  # ProbeClient start: process, torch + script import, preloads
    import_seconds: float  # the server's own measure of its imports
    build_cold: float  # the workload's build in a fresh process (bench_workers.build_cost)
    probes: list[dict[str, float]]  # per probe: wall, steps, setup, in_probe, overhead

    @property
    def median_overhead(self) -> float:
        return statistics.median(p["overhead"] for p in self.probes)


def _client(workload: Workload) -> Any:
    from autobatch.probe.client import ProbeClient

    return ProbeClient(workload.script, list(workload.args), env=dict(MALLOC_ENV))


def _request(batch_size: int, budget: int, steps: int) -> Any:
    from autobatch.records.protocol import ProbeRequest, RunConfig, StepConfig

    return ProbeRequest(
        StepConfig(batch_size, "32-true", "adamw"), RunConfig(budget, 300.0), min_steps=steps, max_steps=steps
    )


def probe_baseline(workload: Workload) -> int:
    """The VmData an autobatch probe of this workload starts with (one uncapped probe at batch 1)."""
    with _client(workload) as client:
        outcome = client.run(_request(1, 64 << 30, 3))
    if outcome.baseline_bytes is None:
        raise RuntimeError(f"{workload.name}: the probe at batch 1 reported no baseline ({outcome.kind})")
    return int(outcome.baseline_bytes)


def probe_overhead(setup: Setup, batch_size: int, repeats: int = 3) -> Overhead:
    """Probes run through autobatch's ProbeClient: wall less the model's own build and steps."""
    build = worker(setup, "build_cost", {"batch_size": batch_size})
    if build.data is None or build.data.get("status") != "ok":
        raise RuntimeError(f"build_cost failed: {build.error or (build.data or {}).get('error')}")
    build_cold = float(build.data["extra"]["cold_seconds"])
    started = time.perf_counter()
    with _client(setup.workload) as client:
        server_start = time.perf_counter() - started
        probes = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            outcome = client.run(_request(batch_size, setup.budget, 3))
            wall = time.perf_counter() - t0
            if outcome.kind != "fits":
                raise RuntimeError(f"overhead probe at {batch_size}: {outcome.kind} {outcome.error_message}")
            steps = sum(outcome.step_seconds)
            probes.append(
                {
                    "wall": wall,
                    "steps": steps,
                    "setup": outcome.setup_seconds,
                    "in_probe": outcome.wall_seconds,
                    "overhead": wall - steps - build_cold,
                }
            )
        return Overhead(batch_size, server_start, client.import_seconds, build_cold, probes)


def fresh_check(setup: Setup, batch_size: int) -> dict[str, Any]:
    """autobatch's answer against the job's own fresh process, with no autobatch code: a fresh ``python`` under
    ``RLIMIT_DATA`` at the budget, 10 AdamW steps (``tests/harness/fresh_process.py``), at the answer and at
    the next batch. ``within``: the answer fits, and the next batch does not, or fits by less than the CPU
    margin (tune's own criterion): the answer is no further than the margin from the fresh process's."""
    sys.path.insert(0, str(SCRIPTS_DIR.parent / "tests"))
    from harness.fresh_process import run_trial

    from autobatch.devices.budget import margin_bytes

    w, line = setup.workload, setup.budget - margin_bytes("cpu", setup.budget)
    trials = {}
    for batch in (batch_size, batch_size + 1):
        trial = run_trial(w.script, list(w.args), batch, setup.budget, CHECK_STEPS, timeout=setup.timeout)
        trials[batch] = {"kind": trial.kind, "steps": trial.steps, "peak_bytes": trial.peak_estimate}
    at, above = trials[batch_size], trials[batch_size + 1]
    above_fits = above["kind"] == "fits" and (above["peak_bytes"] or 0) <= line
    return {"trials": trials, "within": at["kind"] == "fits" and not above_fits}
