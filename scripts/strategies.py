"""Measured maxima per strategy on the CPU (2 ranks), and the per-rank estimates beside them.

Runs ``autobatch tune`` with ``--strategy none``, ``ddp`` and ``fsdp`` (2 ranks) and ``autobatch estimate
--strategy ddp|fsdp --world-size 2`` on one parameter-heavy example under one per-rank cap, then prints
the table (and writes it to ``scripts/results/strategies.md``). ``--from DIR`` reads the JSON files an
earlier run left in DIR instead of running anything::

    python scripts/strategies.py                 # about 20-40 min on 2 busy cores
    python scripts/strategies.py --from /tmp/dist
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT_ARGS = ["--width", "512", "--depth", "64", "--tokens", "1", "--in-features", "512", "--classes", "10"]
COMMON = ["-d", "cpu", "-m", "780MiB", "-p", "32-true", "-o", "adamw", "--no-recompute"]
TUNE = ["--steps", "3", "--max-steps", "3", "--confirm-steps", "4"]


def _run(args: list[str], out: Path) -> None:
    command = [sys.executable, "-m", "autobatch", *args, "--json", "--", *SCRIPT_ARGS]
    print("$ autobatch " + " ".join(args), file=sys.stderr, flush=True)
    with out.open("w") as handle:
        subprocess.run(command, stdout=handle, check=True, cwd=ROOT)


def measure(folder: Path) -> None:
    for strategy in ("none", "ddp", "fsdp"):
        ranks = "1" if strategy == "none" else "2"
        tune = ["tune", "examples/mlp.py", *COMMON, *TUNE, "--strategy", strategy, "--nproc-per-node", ranks]
        _run([*tune, "--output", str(folder / f"result-{strategy}.json")], folder / f"{strategy}.json")
    for strategy in ("ddp", "fsdp"):
        estimate = ["estimate", "examples/mlp.py", *COMMON, "--strategy", strategy, "--world-size", "2"]
        _run([*estimate, "--timeout", "1800"], folder / f"est-{strategy}.json")


def _maximum(path: Path) -> int | None:
    if not path.is_file() or not path.read_text().strip():
        return None
    combos = json.loads(path.read_text())["combinations"]
    return combos[0]["max_batch_size"] if combos else None


def table(folder: Path) -> str:
    lines = [
        "| strategy (2 ranks, 780 MiB per rank) | measured maximum | estimate | estimate / measured |",
        "| --- | --- | --- | --- |",
    ]
    for strategy in ("none", "ddp", "fsdp"):
        measured = _maximum(folder / f"{strategy}.json")
        estimate = _maximum(folder / f"est-{strategy}.json") if strategy != "none" else None
        ratio = f"{estimate / measured:.2f}" if estimate and measured else "-"
        lines.append(f"| {strategy} | {measured or '-'} | {estimate or '-'} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, help="read the JSON files of an earlier run")
    parser.add_argument("--folder", type=Path, default=Path("strategies-run"), help="where a run writes")
    args = parser.parse_args()
    folder = args.source or args.folder
    if args.source is None:
        folder.mkdir(parents=True, exist_ok=True)
        measure(folder)
    text = table(folder)
    print(text)
    results = ROOT / "scripts" / "results"
    results.mkdir(exist_ok=True)
    (results / "strategies.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
