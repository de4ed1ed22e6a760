"""Does a CPU maximum hold in the job's fresh process? ``tune`` with and without the fresh-process offset,
against an independent harness.

For each workload it runs ``autobatch tune`` twice (the offset counted, the default; and
``AUTOBATCH_FRESH_BASELINE=false``: probes count as the forked processes they are), then finds the
largest batch that fits a fresh process under the same budget with the harness of
``tests/harness/fresh_process.py`` (no autobatch code: a fresh ``python`` under ``RLIMIT_DATA`` set before
``exec``, 10 AdamW steps; bisection around the tunes' answers). A distributed workload checks the
harness's fresh ranks (started as ``torchrun`` starts them) at both tunes' maxima and at 98 % of them
instead of a bisection (a DDP trial takes two fresh processes). Prints a table and writes it, headed by
the command, the date and the autobatch version, as a block of ``docs/measurements/fresh-process.md``.

    python scripts/fresh_process.py                 # mlp33m and vit_small under 1 GiB; examples/mlp.py on 2 DDP ranks
    python scripts/fresh_process.py --only mlp33m
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

import measurements  # noqa: E402
from harness.fresh_process import fits_ddp, largest_fitting  # noqa: E402

PAGE = measurements.PAGES / "fresh-process.md"
TITLE = "Maxima in the job's fresh process"
INTRO = (
    "Whether a CPU maximum holds in the job's fresh process (see [How a tune works](../how-a-tune-works.md#budget)): "
    "`python scripts/fresh_process.py` tunes each workload with the fresh-process offset counted (the default) and "
    "without it (`AUTOBATCH_FRESH_BASELINE=false`), and checks both against an independent harness that runs the "
    "script in a fresh process (or fresh ranks started as torchrun starts them) under the same budget."
)
#: (name, script, memory, extra tune arguments)
WORKLOADS = (
    ("mlp33m", "tests/scripts/mlp33m.py", "1GiB", ()),
    ("vit_small", "tests/scripts/vit_small.py", "1GiB", ()),
    ("mlp-ddp2", "examples/mlp.py", "1GiB", ("--strategy", "ddp", "--nproc-per-node", "2")),
)
MiB = 1 << 20


def tune(script: str, memory: str, extra: tuple[str, ...], fresh: bool) -> tuple[int, int, list[int]]:
    """(maximum, budget, offsets) of one tune."""
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "result.json"
        command = [
            sys.executable, "-m", "autobatch", "tune", script, "--device", "cpu", "--memory", memory,
            "-p", "32-true", "-o", "adamw", "--no-recompute", "--no-cache", "--output", str(result), *extra,
        ]  # fmt: skip
        env = {**os.environ, "AUTOBATCH_FRESH_BASELINE": "true" if fresh else "false"}
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(f"tune failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        data = json.loads(result.read_text())
    (combination,) = data["combinations"]
    offsets = data["device"].get("fresh_process", {}).get("offset_bytes", [])
    return int(combination["max_batch_size"]), int(data["device"]["budget_bytes"]), offsets


def within(maximum: int, truth: int) -> str:
    """How a tune's maximum stands against the fresh process's (the acceptance: 1 % above to 3 % below)."""
    share = (maximum - truth) / truth * 100
    ok = -3.0 <= share <= 1.0
    return f"{share:+.1f} % ({'within' if ok else 'outside'})"


def single(name: str, script: str, memory: str, extra: tuple[str, ...]) -> str:
    counted, budget, offsets = tune(script, memory, extra, fresh=True)
    forked, _, _ = tune(script, memory, extra, fresh=False)
    low, high = min(counted, forked), max(counted, forked)
    truth = largest_fitting(script, [], budget, math.floor(low * 0.95), math.ceil(high * 1.05))
    offset = f"{offsets[0] / MiB:+.2f}" if offsets else "-"
    print(f"{name}: counted {counted}, forked {forked}, fresh process {truth}", file=sys.stderr)
    return (
        f"| {name} | {memory} | {budget / MiB:.2f} | {offset} | {counted} | {within(counted, truth)} | "
        f"{forked} | {within(forked, truth)} | {truth} |"
    )


def ranks(name: str, script: str, memory: str, extra: tuple[str, ...]) -> str:
    world = int(extra[extra.index("--nproc-per-node") + 1])
    counted, budget, offsets = tune(script, memory, extra, fresh=True)
    forked, _, _ = tune(script, memory, extra, fresh=False)

    def verdict(batch: int) -> str:
        return f"{batch}: {'fits' if fits_ddp(script, [], batch, budget, world=world) else 'out of memory'}"

    checks = [
        verdict(b) for b in sorted({counted, forked, math.floor(0.98 * counted), math.floor(0.98 * forked)})
    ]
    each = ", ".join(f"{o / MiB:+.2f}" for o in offsets) or "-"
    print(f"{name}: counted {counted}, forked {forked}; " + "; ".join(checks), file=sys.stderr)
    return f"| {name} | {memory} per rank | {budget / MiB:.2f} | {each} | {counted} | - | {forked} | - | {'; '.join(checks)} |"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="a workload's name (repeatable; default: all)")
    parser.add_argument("--output", type=Path, default=PAGE, help="the page the run is written to")
    args = parser.parse_args(argv)
    rows = [
        (ranks if "--strategy" in extra else single)(name, script, memory, extra)
        for name, script, memory, extra in WORKLOADS
        if not args.only or name in args.only
    ]
    lines = [
        *measurements.run_header(measurements.command_line("fresh_process.py", argv)),
        "",
        "| workload | memory | budget (MiB) | offset (MiB) | tune | against the fresh process | tune, forked "
        "| against the fresh process | fresh process's maximum (harness) |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: | --- | --- |",
        *rows,
    ]
    print("\n".join(lines))
    measurements.update(args.output, "runs", lines, title=TITLE, intro=INTRO)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
