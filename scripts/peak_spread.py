"""How much does one probe's peak differ between fresh processes? The evidence behind the CPU margin.

Runs ``autobatch check SCRIPT --batch-size B --json`` (a fresh probe server each time, so a fresh
process) ``--runs`` times, one after another, and reports every peak, the groups they fall into (peaks
closer than ``--gap`` to a neighbour form a group) and the spread, beside the margin ``tune`` keeps under
the budget (:func:`autobatch.devices.budget.margin_bytes`). Prints a table and writes it, headed by the
command, the date and the autobatch version, as the block of ``docs/measurements/peak-spread.md`` for
this script and batch size (``--output`` for another page; other blocks are kept). Arguments after ``--`` go to ``check``
as they are (device, memory, precision, optimizer, steps, the script's own arguments after another
``--``).

    python scripts/peak_spread.py examples/mlp.py --batch-size 64 --runs 16 -- \\
        --device cpu --memory 400MiB -p 32-true -o sgd --no-recompute --steps 5
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import measurements  # noqa: E402

from autobatch.devices.budget import margin_bytes  # noqa: E402

PAGE = measurements.PAGES / "peak-spread.md"
TITLE = "Peak spread between fresh processes"
INTRO = (
    "How much one probe's peak differs between fresh processes: the evidence behind the CPU margin "
    "(see [How a tune works](../how-a-tune-works.md#margin-on-the-cpu)). `python scripts/peak_spread.py` "
    "runs the same `autobatch check` in a fresh process again and again, and groups the peaks (peaks closer "
    "than 512 KiB to a neighbour form a group)."
)

MB, MiB = 1_000_000, 1 << 20


def groups(peaks: list[int], gap: int) -> list[list[int]]:
    """The peaks, sorted, split wherever two neighbours are more than ``gap`` apart."""
    out: list[list[int]] = []
    for peak in sorted(peaks):
        if out and peak - out[-1][-1] <= gap:
            out[-1].append(peak)
        else:
            out.append([peak])
    return out


def report(peaks: list[int], kinds: list[str], budget: int, gap: int, command: str) -> str:
    """The markdown report of one measurement."""
    found = groups(peaks, gap)
    lines = [
        f"- command (each run): `{command}`",
        f"- date: {measurements.now()}; autobatch {measurements.autobatch_version()}",
        f"- runs: {len(peaks)}; verdicts: " + ", ".join(f"{k} {kinds.count(k)}" for k in sorted(set(kinds))),
        f"- budget {budget / MiB:.2f} MiB; the CPU margin tune keeps under it: {margin_bytes('cpu', budget) / MiB:.2f} MiB",
        "",
        "| group | runs | lowest peak (MB) | highest peak (MB) | above the lowest group (MiB) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    base = found[0][0] if found else 0
    for index, group in enumerate(found, 1):
        lines.append(
            f"| {index} | {len(group)} | {group[0] / MB:.2f} | {group[-1] / MB:.2f} | {(group[0] - base) / MiB:.2f} |"
        )
    if peaks:
        lines += ["", f"Spread (highest less lowest): {(max(peaks) - min(peaks)) / MiB:.2f} MiB."]
    return "\n".join(lines) + "\n"


def measure(
    script: str | None, batch: int, runs: int, check_args: list[str]
) -> tuple[list[int], list[str], int, str]:
    """(peaks, verdicts, budget, the command) of ``runs`` fresh checks."""
    shown = [
        "autobatch",
        "check",
        *([script] if script else []),
        "--batch-size",
        str(batch),
        "--json",
        *check_args,
    ]
    cmd = [sys.executable, "-m", *shown]
    env = {k: v for k, v in os.environ.items() if k != "AUTOBATCH_CACHE_DIR"}
    peaks, kinds, budget = [], [], 0
    for run in range(1, runs + 1):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        if proc.returncode not in (0, 5):  # 5: out of memory (its peak still counts)
            raise SystemExit(f"check failed (exit {proc.returncode}):\n{proc.stderr}")
        data = json.loads(proc.stdout)
        peaks.append(int(data["peak_bytes"]))
        kinds.append(str(data["kind"]))
        budget = int(data["budget_bytes"])
        print(f"run {run}/{runs}: {data['kind']} peak {peaks[-1] / MB:.2f} MB", file=sys.stderr)
    return peaks, kinds, budget, shlex.join(shown)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "script", nargs="?", default=None, help="the training script (none with --hf in check's arguments)"
    )
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument(
        "--gap", type=int, default=512 * 1024, help="bytes between two groups (default 512 KiB)"
    )
    parser.add_argument("--output", type=Path, default=PAGE, help="the page the run is written to")
    args = parser.parse_args(argv[:split])
    peaks, kinds, budget, command = measure(args.script, args.batch_size, args.runs, argv[split + 1 :])
    text = report(peaks, kinds, budget, args.gap, command)
    print(text)
    name = Path(args.script).stem if args.script else "check"
    head = [
        f"## {name}, batch {args.batch_size}",
        "",
        f"- made by `{measurements.command_line('peak_spread.py', argv)}`",
    ]
    lines = [*head, *text.splitlines()]
    measurements.update(args.output, f"{name}-{args.batch_size}", lines, title=TITLE, intro=INTRO)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
