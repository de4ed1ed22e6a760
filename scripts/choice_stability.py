"""Choice stability (issue #14, part 2): the root ``autobatch.toml`` tune, run as a new user runs it, N times
while another process keeps one core busy; does it choose the same combination every time?

Each run is ``python -m autobatch tune --refresh --output RUN/result.json`` from the repository root, with
a fresh ``AUTOBATCH_CACHE_DIR`` (so no stored result or probe serves it), nothing else changed. A busy
child (``python -c "while True: pass"``) runs for the whole measurement and is killed at the end, also on
Ctrl-C or an error.

    python scripts/choice_stability.py [--runs 5] [--no-busy] [--output docs/measurements/choice-stability.md]

``--no-busy``: no busy child, a quiet machine (where one probe per contender may time the choice:
``autobatch/core/choice.py``, quiet probes); does the choice hold from run to run there too?

Prints the table (run, chosen combination, micro-batch, samples/s of the winner and the runner-up, the
margin, ``decided_by``, wall time) and the summary "same choice in k of N", and writes them, headed by the
command, the date and the autobatch version, as the block of ``--output`` for this kind of run (one core
kept busy, or ``--no-busy``); the other block and the earlier runs on the page are kept.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import measurements  # noqa: E402  (scripts/ is on sys.path when a script runs)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = measurements.PAGES / "choice-stability.md"
TITLE = "Choice stability"
INTRO = (
    "Does the throughput choice hold from run to run? `python scripts/choice_stability.py` runs the root "
    "`autobatch.toml` tune as a new user runs it (`autobatch tune --refresh` from the repository root, a "
    "fresh `AUTOBATCH_CACHE_DIR`, nothing reduced) N times, with one core kept busy by another process, or "
    "on a quiet machine (`--no-busy`), and tables each run's choice, its margin and how it was decided."
)
BUSY = [sys.executable, "-c", "while True: pass"]


@dataclass(frozen=True)
class Run:
    """One tune's choice, read from its result JSON (``chosen`` None: nothing chosen or the run failed)."""

    number: int
    code: int
    chosen: str | None
    micro_batch_size: int | None
    winner_rate: float | None
    runner_up: str | None
    runner_up_rate: float | None
    margin: float | None
    decided_by: str | None
    seconds: float


def _name(entry: dict) -> str:
    return (
        f"{entry['precision']}/{entry['optimizer']}/{'recompute' if entry['recompute'] else 'no-recompute'}"
    )


def read_run(number: int, code: int, result: dict | None, seconds: float) -> Run:
    """A :class:`Run` from a tune's result JSON (None when the run wrote none)."""
    chosen = (result or {}).get("chosen")
    if not chosen:
        return Run(number, code, None, None, None, None, None, None, None, seconds)
    rates = {_name(c): c.get("samples_per_second") for c in result["combinations"]}  # type: ignore[index]
    name, runner = _name(chosen), chosen.get("runner_up")
    return Run(
        number,
        code,
        name,
        chosen.get("micro_batch_size"),
        rates.get(name),
        runner,
        rates.get(runner) if runner else None,
        chosen.get("margin"),
        chosen.get("decided_by"),
        seconds,
    )


def _num(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def table(runs: list[Run]) -> list[str]:
    """The markdown table, one row per run."""
    lines = [
        "| run | exit | chosen | micro-batch | winner samples/s | runner-up | runner-up samples/s | margin | decided_by | wall |",
        "|---:|---:|---|---:|---:|---|---:|---:|---|---:|",
    ]
    for r in runs:
        decided = (r.decided_by or "-").replace("|", "/")
        lines.append(
            f"| {r.number} | {r.code} | {r.chosen or '-'} | {_num(r.micro_batch_size, 'd')} | "
            f"{_num(r.winner_rate, '.1f')} | {r.runner_up or '-'} | {_num(r.runner_up_rate, '.1f')} | "
            f"{_num(r.margin, '+.1%')} | {decided} | {r.seconds:.0f} s |"
        )
    return lines


def summary(runs: list[Run]) -> str:
    """ "same choice in k of N": k is how many runs chose the most frequent combination."""
    counts = collections.Counter(r.chosen for r in runs if r.chosen is not None)
    if not counts:
        return f"same choice in 0 of {len(runs)} (no run chose a combination)"
    chosen, k = counts.most_common(1)[0]
    margins = [r.margin for r in runs if r.chosen == chosen and r.margin is not None]
    spread = f"; margins {min(margins):+.1%} to {max(margins):+.1%}" if margins else ""
    others = ", ".join(f"{name} {n}x" for name, n in counts.items() if name != chosen)
    return f"same choice in {k} of {len(runs)} ({chosen}{spread}{'; others: ' + others if others else ''})"


def tune_once(number: int, base: Path) -> Run:
    folder = base / f"run-{number}"
    folder.mkdir()
    output = folder / "result.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOBATCH_CACHE_DIR": str(folder / "cache")}
    command = [sys.executable, "-m", "autobatch", "tune", "--refresh", "--output", str(output)]
    started = time.perf_counter()
    tune = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _, stderr = tune.communicate()
    except BaseException:  # Ctrl-C or SIGTERM: let the tune stop its probes and keep them, as a user's would
        tune.terminate()
        tune.wait(timeout=60)
        raise
    seconds = time.perf_counter() - started
    if tune.returncode != 0:
        print(stderr[-2000:], file=sys.stderr)
    result = json.loads(output.read_text()) if output.exists() else None
    return read_run(number, tune.returncode, result, seconds)


def header(argv: list[str], loads: tuple[float, float], busy: bool) -> list[str]:
    return [
        "## " + ("One core kept busy" if busy else "A quiet machine (no busy process)"),
        "",
        *measurements.run_header(
            measurements.command_line("choice_stability.py", argv),
            extra=[
                "- each run: `autobatch tune --refresh --output RUN/result.json` from the repository root with a "
                "fresh `AUTOBATCH_CACHE_DIR`",
                f"- busy process during every run: `{shlex.join(['python', *BUSY[1:]])}`"
                if busy
                else "- no busy process",
                f"- load average (1 min) at start {loads[0]:.1f}, at end {loads[1]:.1f} ("
                + ("the busy process is 1, " if busy else "")
                + "a tune about 1; the rest is other work on the machine)",
            ],
        ),
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="how many tunes (default 5)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="where the table is written")
    parser.add_argument("--no-busy", action="store_true", help="no busy process: a quiet machine")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the busy child is killed on SIGTERM too
    load_start = os.getloadavg()[0]
    busy = None if args.no_busy else subprocess.Popen(BUSY)
    runs: list[Run] = []
    try:
        with tempfile.TemporaryDirectory(prefix="autobatch-choice-") as tmp:
            for number in range(1, args.runs + 1):
                runs.append(tune_once(number, Path(tmp)))
                print(table(runs)[-1], flush=True)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    lines = [
        *header(argv, (load_start, os.getloadavg()[0]), busy is not None),
        *table(runs),
        "",
        f"**{summary(runs)}**",
    ]
    print("\n".join(lines))
    key = "busy" if busy is not None else "quiet"
    measurements.update(args.output, key, lines, title=TITLE, intro=INTRO)
    return 0 if all(r.code == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
