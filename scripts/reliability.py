"""The reliability report (issue #10): every bad input of the catalogue and every injected fault, run
against the real command, with a table of how each ended.

Bad inputs (``tests/reliability/catalogue.py``): each must end with its documented exit code, a message
that names the problem and the fix, and no traceback. Faults (``tests/reliability/faults.py``): each must
end with its documented exit code, with no process of the tune left (its whole process tree is watched
with psutil) and no probe lost (every probe measured before the fault is in the result or the journal).
A full disk while the result is written is injected in-process (``tests/reliability/test_output.py``).

    python scripts/reliability.py [--skip-faults]

Prints the tables and writes them, headed by the command, the date and the autobatch version, to
``docs/measurements/reliability.md``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import measurements  # noqa: E402  (scripts/ is on sys.path when a script runs)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
PAGE = measurements.PAGES / "reliability.md"
TITLE = "Reliability report"
INTRO = (
    "Every bad input of the catalogue (`tests/reliability/catalogue.py`) and every injected fault "
    "(`tests/reliability/faults.py`), run against the real command by `python scripts/reliability.py`. A bad "
    "input must end with its documented exit code, a message that names the problem and the fix, and no "
    "traceback; a fault must end with its documented exit code, no process of the tune left and no probe "
    "lost. What each guards against: [Reliability](../reliability.md)."
)


def inputs_table(base: Path) -> tuple[list[str], bool]:
    from reliability.catalogue import CASES, judge, run_case

    rows, handled, documented = [], 0, 0
    for index, case in enumerate(CASES):
        folder = base / f"input-{index}"
        folder.mkdir()
        os.environ["AUTOBATCH_CACHE_DIR"] = str(folder / "cache")
        ran = run_case(case, folder)
        problems = judge(case, ran)
        handled += not problems
        documented += ran.code == case.code
        message = _first_error(ran.stderr)
        rows.append(
            f"| {case.name} | {case.mode} | {ran.code} | {'yes' if not problems else '; '.join(problems)} | {message} |"
        )
        print(rows[-1], flush=True)
    head = [
        f"**Bad inputs: {len(CASES)} tried, {handled} handled with a clear error, {documented} with the documented exit code.**",
        "",
        "| input | run | exit | handled | message (first line) |",
        "|---|---|---:|---|---|",
    ]
    return head + rows, handled == len(CASES)


def faults_table(base: Path) -> tuple[list[str], bool]:
    from reliability.faults import EXPECTED, all_faults

    runs = all_faults(base / "faults")
    rows, survived, lost, stray = [], 0, 0, 0
    for run in runs:
        ok = run.code == EXPECTED[run.name] and not run.stray and run.lost == 0
        ok = ok and "Traceback (most recent call last)" not in run.stderr
        survived += ok
        lost += run.lost
        stray += len(run.stray)
        rows.append(
            f"| {run.name} | {run.code} (expected {EXPECTED[run.name]}) | {run.result.get('status', '-')} | "
            f"{run.lost} | {len(run.stray)} | {run.seconds:.0f} s | {_first_error(run.stderr) or _last(run.stderr)} |"
        )
    full_disk = _full_disk()
    survived += full_disk
    rows.append(
        f"| disk full while the result is written (in-process) | 2 (expected 2) | - | 0 | 0 | - | "
        f"{'previous file intact, answer printed first' if full_disk else 'FAILED'} |"
    )
    total = len(runs) + 1
    head = [
        f"**Faults: {total} injected, {survived} survived; probes lost: {lost}; stray processes: {stray}.**",
        "",
        "| fault | exit | result status | probes lost | stray processes | wall | message |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    return head + rows, survived == total and lost == 0 and stray == 0


def _full_disk() -> bool:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/reliability/test_output.py::test_a_full_disk_shows_the_answer_names_the_fix_and_keeps_the_old_file"],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    return done.returncode == 0


def _first_error(stderr: str) -> str:
    start = stderr.find("error:")
    if start < 0:
        return ""
    end = stderr.find(" hint:", start)
    text = stderr[start : end if end > 0 else start + 160]
    return text[:160].replace("|", "/")


def _last(stderr: str) -> str:
    """The end of a run that did not fail: its choice, else how it ended."""
    start = stderr.find("chosen (")
    text = stderr[start : start + 140] if start >= 0 else stderr[-120:]
    return text.replace("|", "/")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-faults", action="store_true", help="run the catalogue only")
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="autobatch-reliability-") as tmp:
        lines, ok_inputs = inputs_table(Path(tmp))
        ok_faults = True
        if not args.skip_faults:
            fault_lines, ok_faults = faults_table(Path(tmp))
            lines += ["", *fault_lines]
    head = measurements.run_header(
        measurements.command_line("reliability.py", sys.argv[1:]),
        extra=[f"- {time.perf_counter() - started:.0f} s in all"],
    )
    lines = ["## Latest run", "", *head, "", *lines]
    text = "\n".join(lines) + "\n"
    print(text)
    measurements.update(PAGE, "reliability", lines, title=TITLE, intro=INTRO)
    return 0 if ok_inputs and ok_faults else 1


if __name__ == "__main__":
    sys.exit(main())
