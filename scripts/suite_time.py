"""How long the README's test command takes from a fresh clone: issue 34's goal of at most 15 minutes.

Each round clones the repository's committed state into a temporary folder, as a new contributor would,
and runs the README's two halves there, timed apart: ``bash scripts/setup.sh --dev`` (a new ``.venv``) and
``.venv/bin/python -m pytest``. It records each half's wall time, pytest's summary line, how busy the
machine's CPUs were over the run (from ``/proc/stat``: the share idle and the share in the kernel) and the
load average before it; it writes the table to ``docs/measurements/suite-time.md`` and removes the clone.

    python scripts/suite_time.py [--rounds 1] [--goal 900] [--output docs/measurements/suite-time.md]

Run it on a quiet machine: the suite keeps both cores busy, and anything else running slows it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import measurements

PAGE = measurements.PAGES / "suite-time.md"
TITLE = "The test suite's time"
INTRO = (
    "How long the README's test command (`bash scripts/setup.sh --dev && .venv/bin/python -m pytest`) takes "
    "in a fresh clone, setup included: issue 34's goal is at most 15 minutes (900 s) on the 2-core development "
    "machine. Written by `scripts/suite_time.py`; how the suite is run (workers, marks, the one queue) is in "
    "[Development](../development.md#what-ci-runs)."
)
SUMMARY = re.compile(r"^=*\s*(\d+ (passed|failed).*?) in [\d.]+s", re.M)
FAILED = re.compile(r"^FAILED (\S+)", re.M)


@dataclass
class Round:
    setup_seconds: float
    pytest_seconds: float
    pytest_status: int
    summary: str
    idle: float  # the share of the machine's CPU time idle over the pytest half
    kernel: float  # the share spent in the kernel
    load_before: float
    failed: list[str]  # the failing tests' ids, from pytest's short summary

    @property
    def total(self) -> float:
        return self.setup_seconds + self.pytest_seconds


def cpu_times() -> list[int]:
    """The machine's CPU time counters (``/proc/stat``'s first line: user, nice, system, idle, iowait, ...)."""
    with open("/proc/stat", encoding="ascii") as handle:
        return [int(field) for field in handle.readline().split()[1:]]


def clean_env() -> dict[str, str]:
    """This environment as a new shell's would be: no virtual environment of this checkout on the path, no
    ``PYTHONPATH`` (the clone must install and find everything itself)."""
    ours = str(measurements.ROOT / ".venv" / "bin")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != ours)
    return env


def timed(command: list[str], cwd: Path, log: Path) -> tuple[float, int]:
    """(wall seconds, exit status) of ``command`` run in ``cwd``, its output appended to ``log``."""
    started = time.perf_counter()
    with log.open("a") as out:
        done = subprocess.run(
            command, cwd=cwd, env=clean_env(), stdout=out, stderr=subprocess.STDOUT, check=False
        )
    return time.perf_counter() - started, done.returncode


def one_round(folder: Path) -> Round:
    clone = folder / "autobatch"
    subprocess.run(["git", "clone", "--quiet", str(measurements.ROOT), str(clone)], check=True)
    log = folder / "log.txt"
    load = os.getloadavg()[0]
    setup, status = timed(["bash", "scripts/setup.sh", "--dev"], clone, log)
    if status != 0:
        raise SystemExit(f"the setup failed ({status}):\n{log.read_text(errors='replace')[-3000:]}")
    before = cpu_times()
    took, status = timed([str(clone / ".venv" / "bin" / "python"), "-m", "pytest"], clone, log)
    after = cpu_times()
    spent = [b - a for a, b in zip(before, after, strict=True)]
    text = log.read_text(errors="replace")
    found = SUMMARY.findall(text)
    return Round(
        setup_seconds=setup,
        pytest_seconds=took,
        pytest_status=status,
        summary=found[-1][0] if found else "no summary line",
        idle=(spent[3] + spent[4]) / sum(spent),
        kernel=(spent[2] + spent[5] + spent[6]) / sum(spent),
        load_before=load,
        failed=FAILED.findall(text),
    )


def table(rounds: list[Round], goal: float) -> list[str]:
    lines = [
        "| round | setup (s) | pytest (s) | in all (s) | goal | pytest says | CPU idle | in the kernel | load before |",
        "|---:|---:|---:|---:|:-:|---|---:|---:|---:|",
    ]
    for number, r in enumerate(rounds, 1):
        met = "met" if r.total <= goal and r.pytest_status == 0 else "**missed**"
        lines.append(
            f"| {number} | {r.setup_seconds:.0f} | {r.pytest_seconds:.0f} | {r.total:.0f} | {met} | {r.summary} | "
            f"{r.idle:.1%} | {r.kernel:.1%} | {r.load_before:.1f} |"
        )
    lines.extend(f"- round {n} failed: `{test}`" for n, r in enumerate(rounds, 1) for test in r.failed)
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--goal", type=float, default=900.0, help="seconds, setup included")
    parser.add_argument("--output", type=Path, default=PAGE)
    args = parser.parse_args(argv)
    started = measurements.now()
    rounds = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="suite-time-") as folder:
            rounds.append(one_round(Path(folder)))
        print("\n".join(table(rounds, args.goal)[-1:]), flush=True)
    lines = [
        *measurements.run_header(measurements.command_line("suite_time.py", argv), date=started),
        "",
        *table(rounds, args.goal),
    ]
    print("\n".join(lines))
    measurements.update(args.output, "suite-time", lines, title=TITLE, intro=INTRO)
    measurements.write_data(
        measurements.DATA / "suite-time.json",
        json.dumps([{**asdict(r), "total": r.total} for r in rounds], indent=2) + "\n",
    )
    return 0 if all(r.pytest_status == 0 for r in rounds) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
