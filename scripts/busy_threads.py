"""Why a busy core slows a tune tenfold, and what OpenMP's passive wait policy does about it.

A training step of ``examples/gpt.py`` (AdamW, batch 16, torch's default intra-op threads) is timed in a
fresh process, alone and beside one busy core (``python -c "while True: pass"``), with OpenMP's default
wait policy (threads spin while they wait for each other) and with ``OMP_WAIT_POLICY=PASSIVE`` (they
sleep). The four cases run in turn, ``--rounds`` times, so that drift in the machine's speed spreads over
all of them. Per case: the median, the fastest and the slowest of the runs' median step time (steps 2 to
``--steps``; the first allocates the optimizer state).

    python scripts/busy_threads.py [--rounds 3] [--steps 8] [--output docs/measurements/busy-threads.md]

``autobatch/probe/yielding.py`` acts on what this shows: once a probe's threads waited for a core, the
probe server restarts with the passive policy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import measurements  # noqa: E402  (scripts/ is on sys.path when a script runs)

ROOT = Path(__file__).resolve().parent.parent
PAGE = measurements.PAGES / "busy-threads.md"
TITLE = "A busy core and OpenMP's wait policy"
INTRO = (
    "Why a busy core slowed a tune tenfold, and what OpenMP's passive wait policy does about it: one "
    "training step of `examples/gpt.py` timed in a fresh process, alone and beside one busy core, with "
    "OpenMP's default wait policy (threads spin while they wait for each other) and with "
    "`OMP_WAIT_POLICY=PASSIVE` (they sleep). `autobatch/probe/yielding.py` acts on it: once a probe's "
    "threads waited for a core, the probe server restarts with the passive policy."
)
BUSY = [sys.executable, "-c", "while True: pass"]
STEP = """
import importlib.util, json, sys, time
import torch
spec = importlib.util.spec_from_file_location("gpt", sys.argv[1])
gpt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpt)
model = gpt.build_model()
optimizer = torch.optim.AdamW(model.parameters())
batch = gpt.make_batch(int(sys.argv[2]))
seconds = []
for _ in range(int(sys.argv[3])):
    started = time.perf_counter()
    gpt.compute_loss(model, batch).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    seconds.append(time.perf_counter() - started)
print(json.dumps({"seconds": seconds, "threads": torch.get_num_threads()}))
"""
CASES = (("alone", None), ("alone", "PASSIVE"), ("one busy core", None), ("one busy core", "PASSIVE"))


def _step_time(policy: str | None, batch: int, steps: int) -> tuple[float, int]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    script = str(ROOT / "examples" / "gpt.py")
    out = subprocess.run(
        [sys.executable, "-c", STEP, script, str(batch), str(steps)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(out.stdout)
    return statistics.median(data["seconds"][1:]), data["threads"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--output", type=Path, default=PAGE, help="the page the run is written to")
    args = parser.parse_args()
    times: dict[tuple[str, str | None], list[float]] = {case: [] for case in CASES}
    threads = 0
    started = time.time()
    for _ in range(args.rounds):
        for load, policy in CASES:
            busy = subprocess.Popen(BUSY) if load != "alone" else None
            try:
                if busy is not None:
                    time.sleep(0.3)  # its interpreter is up and spinning
                seconds, threads = _step_time(policy, args.batch, args.steps)
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
            times[(load, policy)].append(seconds)
    lines = [
        "## Latest run",
        "",
        *measurements.run_header(
            measurements.command_line(
                "busy_threads.py",
                ["--rounds", str(args.rounds), "--steps", str(args.steps), "--batch", str(args.batch)],
            ),
            extra=[
                f"- {time.time() - started:.0f} s in all; torch's intra-op threads: {threads}",
                f"- AdamW, batch {args.batch}, a fresh process per run; per run the median of steps 2-{args.steps}",
            ],
        ),
        "",
        "| load | OMP_WAIT_POLICY | median step (s) | fastest run | slowest run |",
        "|---|---|---:|---:|---:|",
    ]
    for (load, policy), values in times.items():
        lines.append(
            f"| {load} | {policy or '(default)'} | {statistics.median(values):.3f} | {min(values):.3f} | "
            f"{max(values):.3f} |"
        )
    print("\n".join(lines))
    measurements.update(args.output, "busy-threads", lines, title=TITLE, intro=INTRO)


if __name__ == "__main__":
    main()
