"""How much faster a command is through a running daemon (``autobatch serve``) than cold, side by side.

In one run, in interleaved rounds (each round runs both sides of every case, their order swapped from one
round to the next), with the real command in a folder of its own (the quick start's ``autobatch.toml`` and
``examples/gpt.py``, a private cache, lock and daemon folder):

* ``cached``: a tune served from the result cache (the quick-start command run again), through the daemon and
  cold: the issue's "cached command" (a ``check`` always probes: nothing of it is cached);
* ``check``: one probe at batch 8, through the daemon and cold;
* ``quickstart``: the quick-start tune (``autobatch tune`` on the root ``autobatch.toml``, each run with a fresh
  cache folder), through the daemon and in-process;
* ``trainer``: a ``check`` of ``examples/as_is/hf_trainer.py`` (a Hugging Face ``Trainer`` script run as it is),
  after a first run on each side that is not a round (:data:`FIRST_RUNS`): through the daemon, from the warm
  parent that keeps ``transformers`` imported.

Prints a table and writes it, headed by the command, the date and the autobatch version, as a block of
``docs/measurements/daemon.md``.

    python scripts/daemon_bench.py              # 2 rounds: about 15 minutes on 2 busy cores
    python scripts/daemon_bench.py --rounds 3
    python scripts/daemon_bench.py --cases cached check   # the cheap cases only
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import measurements  # noqa: E402

PAGE = measurements.PAGES / "daemon.md"
TITLE = "The daemon against cold commands"
INTRO = (
    "What a running daemon saves ([The daemon](../daemon.md)): `python scripts/daemon_bench.py` runs each "
    "command through a running daemon and as a cold command (its own process: Python, autobatch and torch "
    "imported, its own probe server started) side by side, in interleaved rounds, with the real command. "
    "Wall times are of the whole command, as a job script sees them."
)
#: key: (case, arguments after ``autobatch``, goal: cold over daemon at least this, a fresh cache each run)
CASES = {
    "cached": ("tune served from the cache", ["tune", "--output", "r.json", "--json"], 5.0, False),
    "check": (
        "check (one probe at batch 8)",
        ["check", "--batch-size", "8", "--steps", "3", "--json"],
        5.0,
        False,
    ),
    "quickstart": ("quick-start tune (fresh cache)", ["tune", "--output", "r.json", "--json"], 1 / 0.7, True),
    "trainer": (
        "check of a Hugging Face `Trainer` script (batch 16)",
        [
            "check",
            "examples/as_is/hf_trainer.py",
            "--device",
            "cpu",
            "--memory",
            "1GiB",
            "--batch-size",
            "16",
            "--steps",
            "3",
            "--json",
            "--",
            "--batch-size",
            "{batch}",
        ],  # fmt: skip
        5.0,
        False,
    ),
}
#: Cases whose first run on each side is not a round: it measures what the next ones reuse (the job's fresh
#: process, kept in the cache; through the daemon, the script's libraries, which a warm parent then keeps).
FIRST_RUNS = ("trainer",)


def run(args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, dict[str, Any]]:
    """(wall seconds, JSON output) of ``autobatch ARGS``."""
    took, _, output = measurements.run_autobatch(args, env, cwd)
    return took, output


def answer(output: dict[str, Any]) -> str:
    """What the command answered, for the side-by-side check: the maxima of a tune, the verdict of a check."""
    if "combinations" in output:
        return " ".join(str(c.get("max_batch_size")) for c in output["combinations"])
    return "fits" if output.get("fits") else "does not fit"


def measure(rounds: int, keys: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    cases = [CASES[key] for key in keys]
    with tempfile.TemporaryDirectory(prefix="abd-bench-") as tmp:
        work = Path(tmp) / "work"
        (work / "examples").mkdir(parents=True)
        shutil.copy(ROOT / "autobatch.toml", work / "autobatch.toml")
        shutil.copy(ROOT / "examples" / "gpt.py", work / "examples" / "gpt.py")
        (work / "examples" / "as_is").mkdir()
        shutil.copy(
            ROOT / "examples" / "as_is" / "hf_trainer.py", work / "examples" / "as_is" / "hf_trainer.py"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOBATCH_")}
        env.update(
            NO_COLOR="1",
            AUTOBATCH_CACHE_DIR=str(Path(tmp) / "cache"),
            AUTOBATCH_LOCK_DIR=str(
                Path(tmp) / "locks"
            ),  # other users' tunes on a shared machine do not queue it
            AUTOBATCH_DAEMON_DIR=str(Path(tmp) / "d"),
        )
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        daemon_env = {**env, "AUTOBATCH_DAEMON": "on"}
        started = time.perf_counter()
        run(["daemon", "start"], daemon_env, work)
        start_seconds = time.perf_counter() - started
        try:
            if "cached" in keys:
                run(CASES["cached"][1], env, work)  # fills the cache the cached case is served from
            firsts = {
                key: first_runs(CASES[key][1], env, daemon_env, work) for key in keys if key in FIRST_RUNS
            }
            times: dict[tuple[str, str], list[float]] = {}
            answers: dict[tuple[str, str], set[str]] = {}
            fresh = 0
            for number in range(rounds):
                for case, args, _goal, fresh_cache in cases:
                    sides = [("cold", env), ("daemon", daemon_env)]
                    for side, side_env in sides if number % 2 == 0 else reversed(sides):
                        if fresh_cache:
                            fresh += 1
                            side_env = {**side_env, "AUTOBATCH_CACHE_DIR": str(Path(tmp) / f"cache{fresh}")}
                        took, output = run(args, side_env, work)
                        times.setdefault((case, side), []).append(took)
                        answers.setdefault((case, side), set()).add(answer(output))
                        print(f"round {number + 1} {case} {side}: {took:.1f} s", file=sys.stderr)
        finally:
            run(["daemon", "stop"], daemon_env, work)
    rows = []
    for case, _args, goal, _fresh in cases:
        cold, warm = times[(case, "cold")], times[(case, "daemon")]
        ratio = statistics.median(cold) / statistics.median(warm)
        rows.append(
            {
                "case": case,
                "cold": cold,
                "daemon": warm,
                "ratio": ratio,
                "goal": goal,
                "answers": (sorted(answers[(case, "cold")]), sorted(answers[(case, "daemon")])),
            }
        )
    return rows, {"start": start_seconds, "firsts": firsts}


def first_runs(
    args: list[str], env: dict[str, str], daemon_env: dict[str, str], work: Path
) -> dict[str, float | None]:
    """A case's first run cold, then through the daemon, and how long after it the daemon's warm parent was
    ready (seconds each; the parent's ready time is None when none came within a minute)."""
    cold, _ = run(args, env, work)
    daemon, _ = run(args, daemon_env, work)
    ended = time.perf_counter()
    ready: float | None = None
    while time.perf_counter() - ended < 60:
        _took, status = run(["daemon", "status", "--json"], daemon_env, work)
        if any(parent["state"] == "ready" for parent in status.get("warm_parents", [])):
            ready = time.perf_counter() - ended
            break
        time.sleep(0.2)
    return {"cold": cold, "daemon": daemon, "parent_ready": ready}


def render(
    rows: list[dict[str, Any]], more: dict[str, Any], rounds: int, load: tuple[float, ...], command: str
) -> list[str]:
    firsts = [
        f"- {CASES[key][0]}: its first run, not a round, took {first['cold']:.1f} s cold (the job's fresh process "
        f"measured and kept in the cache) and {first['daemon']:.1f} s through the daemon (the script's libraries "
        "imported by its probe server); the daemon's warm parent for them was ready "
        + (
            f"{first['parent_ready']:.1f} s after"
            if first["parent_ready"] is not None
            else "not within a minute"
        )
        for key, first in more["firsts"].items()
    ]
    lines = [
        f"## Through the daemon and cold, side by side ({rounds} interleaved rounds)",
        "",
        *measurements.run_header(
            command,
            extra=[
                f"- load average {' / '.join(f'{x:.1f}' for x in load)} over 1 / 5 / 15 min when it began: the "
                "machine was shared with other work, so only the ratios side by side mean anything",
                f"- the daemon took {more['start']:.1f} s to start (not counted in the rows)",
                *firsts,
            ],
        ),
        "",
        "| case | cold (each round) | daemon (each round) | cold / daemon (medians) | goal | met | answers cold / daemon |",
        "|---|---:|---:|---:|---:|:-:|---|",
    ]
    for r in rows:
        goal = f"{r['goal']:.0f}x faster" if r["goal"] >= 2 else f"{1 - 1 / r['goal']:.0%} less wall"
        each = lambda xs: ", ".join(f"{x:.2f} s" if x < 1 else f"{x:.1f} s" for x in xs)  # noqa: E731
        cold, warm = r["answers"]
        lines.append(
            f"| {r['case']} | {each(r['cold'])} | {each(r['daemon'])} | {r['ratio']:.2f}x "
            f"({1 - 1 / r['ratio']:.0%} less wall) | {goal} | {'yes' if r['ratio'] >= r['goal'] else 'no'} | "
            f"{' / '.join(cold)} : {' / '.join(warm)} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    args = parser.parse_args()
    load = os.getloadavg()
    rows, more = measure(args.rounds, args.cases)
    lines = render(rows, more, args.rounds, load, measurements.command_line("daemon_bench.py", sys.argv[1:]))
    print("\n".join(lines))
    measurements.update(PAGE, "daemon", lines, title=TITLE, intro=INTRO)
    print(f"written to {measurements.shown(PAGE)}")


if __name__ == "__main__":
    main()
