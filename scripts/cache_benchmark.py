"""How fast is a re-run? A cold tune, then identical tunes served from the cache, with the real command.

Per example, in a fresh cache folder: one cold ``autobatch tune`` (every probe measured), then
``--repeats`` identical runs (served from the stored result: no probe server, no torch import), then one
run after the script's local module changed in a way the cache must notice (a copy of the example
with a comment added: the stored result is not served and the probes run again). Two floors: ``autobatch
--version`` (the interpreter and the CLI's imports) and ``autobatch cache list -q`` (a command with options:
the Typer in use here coerces options through pydantic, whose import alone is a few tenths of a second).
Wall times are of the whole command, as a job script sees them; the children run with Python's default
bytecode cache (as an installed package does; ``PYTHONDONTWRITEBYTECODE`` is dropped). The load average at
the start is part of the report: on a busy machine everything, the floors included, takes longer.
Prints a table and writes it, headed by the command, the date and the autobatch version, to
``docs/measurements/cache.md``.

    python scripts/cache_benchmark.py [--examples mlp gpt] [--memory 400MiB] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import measurements  # noqa: E402  (scripts/ is on sys.path when a script runs)

ROOT = Path(__file__).resolve().parent.parent
PAGE = measurements.PAGES / "cache.md"
TITLE = "Re-runs from the cache"
INTRO = (
    "How fast a second identical tune is, with the real command: per example, in a fresh cache folder, one "
    "cold `autobatch tune` (every probe measured), then identical runs (served from the stored result: no "
    "probe server, no torch import), then one run after the script changed (not served: probed again). Two "
    "floors for comparison: `autobatch --version` and `autobatch cache list -q`. Wall times are of the "
    "whole command, as a job script sees them."
)
GRID = ["-p", "32-true", "-o", "sgd", "--no-recompute"]


def run(args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, dict[str, Any]]:
    return measurements.run_autobatch(args, env, cwd)


def measure(example: str, memory: str, repeats: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="autobatch-cache-bench-") as tmp:
        work = Path(tmp)
        script = work / f"{example}.py"
        shutil.copy(ROOT / "examples" / f"{example}.py", script)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("AUTOBATCH_") and k != "PYTHONDONTWRITEBYTECODE"
        }
        env.update(
            NO_COLOR="1", AUTOBATCH_CACHE_DIR=str(work / "cache"), AUTOBATCH_LOCK_DIR=str(work / "locks")
        )
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        args = [
            "tune",
            str(script),
            "--device",
            "cpu",
            "--memory",
            memory,
            *GRID,
            "--output",
            "r.json",
            "--json",
        ]
        for what, floor in (
            ("floor: autobatch --version", ["--version"]),
            ("floor: autobatch cache list -q", ["cache", "list", "-q"]),
        ):
            took, cpu, _ = run(floor, env, work)
            rows.append({"example": example, "run": what, "seconds": took, "cpu": cpu})
        took, cpu, result = run(args, env, work)
        rows.append(_row(example, "cold: every probe measured", took, cpu, result))
        warm = [run(args, env, work) for _ in range(repeats)]
        assert all(r[2].get("cache", {}).get("served") for r in warm), "an identical re-run was not served"
        rows.append(
            _row(
                example,
                f"identical re-run, served (median of {repeats}; slowest {max(w[0] for w in warm):.2f} s)",
                statistics.median(w[0] for w in warm),
                statistics.median(w[1] for w in warm),
                warm[-1][2],
            )
        )
        script.write_text(script.read_text() + "\n# edited\n")
        took, cpu, result = run(args, env, work)
        assert "cache" not in result, "an edited script was served from the cache"
        rows.append(_row(example, "after editing the script: not served, probed again", took, cpu, result))
    return rows


def _row(example: str, what: str, took: float, cpu: float, result: dict[str, Any]) -> dict[str, Any]:
    return {
        "example": example,
        "run": what,
        "seconds": took,
        "cpu": cpu,
        "probes": result.get("probes"),
        "max_batch": result["combinations"][0]["max_batch_size"],
    }


def render(
    rows: list[dict[str, Any]], memory: str, load: tuple[float, float, float], command: str
) -> list[str]:
    lines = [
        f"## A second identical tune (CPU device, --memory {memory}, {' '.join(GRID)})",
        "",
        *measurements.run_header(
            command,
            extra=[
                f"- load average {' / '.join(f'{x:.1f}' for x in load)} over 1 / 5 / 15 min when it began",
            ],
        ),
        "",
        "| example | run | wall time | CPU time | probes | max batch |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        probes = "-" if r.get("probes") is None else str(r["probes"])
        top = "-" if r.get("max_batch") is None else str(r["max_batch"])
        lines.append(
            f"| {r['example']} | {r['run']} | {r['seconds']:.2f} s | {r['cpu']:.2f} s | {probes} | {top} |"
        )
    lines += [
        "",
        "CPU time counts the command and every process it waited for (probe server, probes).",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--examples", nargs="+", default=["mlp", "gpt"])
    parser.add_argument("--memory", default="400MiB")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()
    rows = [row for example in args.examples for row in measure(example, args.memory, args.repeats)]
    lines = render(rows, args.memory, load, measurements.command_line("cache_benchmark.py", sys.argv[1:]))
    print("\n".join(lines))
    measurements.update(PAGE, "cache", lines, title=TITLE, intro=INTRO)
    print(f"written to {measurements.shown(PAGE)}")


if __name__ == "__main__":
    main()
