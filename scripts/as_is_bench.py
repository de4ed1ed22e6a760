"""What a probe of a script run as it is costs, and whether its maximum holds in the job's fresh process.

For the plain loop (``examples/as_is/plain_loop.py``, run as it is) and its three-function twin
(``tests/scripts/as_is/plain_loop_twin.py``, tuned at the loop's own precision and optimizer) under the same
device and memory, it runs ``autobatch tune`` (no cache) and reports the probes, the wall time and the
maximum. Then, in the same run and interleaved, a few probes of each at the same small batch and the same
number of steps through the probe server (:class:`autobatch.probe.client.ProbeClient`): a probe's fixed cost
is its wall time less its steps' own time (the sum of ``step_seconds``), the median over the probes. Last, the
largest batch of the plain loop that fits a fresh process under the tune's budget, found by the independent
harness of ``tests/harness/as_is_process.py`` (no autobatch code: a fresh ``python`` under ``RLIMIT_DATA``
set before ``exec`` runs the script as ``__main__`` until 10 optimizer steps; bisection in a tight bracket
around the tune's answer). Prints a table and writes it, headed by the command, the date and the autobatch
version, as a block of ``docs/measurements/as-is.md``.

    python scripts/as_is_bench.py                   # about 10 minutes on 2 cores
    python scripts/as_is_bench.py --no-harness      # the tunes and the fixed costs alone
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

import measurements  # noqa: E402
from harness.as_is_process import largest_fitting_as_is  # noqa: E402

PAGE = measurements.PAGES / "as-is.md"
TITLE = "A script run as it is"
INTRO = (
    "What a probe of a script run as it is (see [The script you already have](../as-is.md)) costs next to a "
    "probe of the same model written as three functions, and whether its maximum holds in the job's fresh "
    "process: `python scripts/as_is_bench.py` tunes `examples/as_is/plain_loop.py` as it is and its "
    "three-function twin `tests/scripts/as_is/plain_loop_twin.py` at the loop's own precision and optimizer, "
    "times a few probes of each at the same small batch in the same run, and checks the plain loop's maximum "
    "against an independent harness that runs the script in a fresh process under the same budget."
)
MEMORY = "1GiB"
PLAIN = "examples/as_is/plain_loop.py"
PLAIN_ARGS = ("--batch-size", "{batch}")
TWIN = "tests/scripts/as_is/plain_loop_twin.py"
TWIN_OPTIONS = ("-p", "32-true", "-o", "adamw", "--no-recompute")
#: Above the fresh process's maximum by more than this share, a maximum would not hold in the job.
ABOVE = 0.01


@dataclass
class Tuned:
    maximum: int
    probes: int
    wall: float
    budget: int


@dataclass
class Probes:
    """The fixed-cost probes of one script: each one's wall time and its steps' own time."""

    walls: list[float] = field(default_factory=list)
    steps: list[float] = field(default_factory=list)
    setups: list[float] = field(default_factory=list)

    @property
    def fixed(self) -> list[float]:
        return [wall - steps for wall, steps in zip(self.walls, self.steps, strict=False)]


def tune(script: str, options: tuple[str, ...], args: tuple[str, ...]) -> Tuned:
    """One cold tune through the command (``--json --output``)."""
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "result.json"
        command = [
            sys.executable, "-m", "autobatch", "tune", script, "--device", "cpu", "--memory", MEMORY,
            "--no-cache", "--json", "--output", str(result), *options,
        ]  # fmt: skip
        if args:
            command += ["--", *args]
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(f"tune of {script} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        data = json.loads(result.read_text())
    (combination,) = data["combinations"]
    return Tuned(
        int(combination["max_batch_size"]), int(data["probes"]), float(data["wall_seconds"]),
        int(data["device"]["budget_bytes"]),
    )  # fmt: skip


def fixed_costs(budget: int, batch: int, steps: int, samples: int) -> tuple[Probes, Probes]:
    """``samples`` probes of the plain loop as it is and of its twin at ``batch``, ``steps`` steps each,
    alternating, each through a server started as a tune starts it (the twin's without the fresh-process
    offset, which changes its cap and its readings, not its time), holding the device's lock as a tune does."""
    from autobatch.devices.cpu import MALLOC_ENV
    from autobatch.devices.selection import resolve_targets
    from autobatch.devices.visible import PROBE_ENV
    from autobatch.probe.client import ProbeClient
    from autobatch.records.protocol import ProbeRequest, RunConfig, StepConfig
    from autobatch.run.locks import RunLock
    from autobatch.step.spec import ScriptSpec

    env = {**MALLOC_ENV, **PROBE_ENV}
    plain_spec = ScriptSpec("as_is", str(ROOT / PLAIN), {"batch_env": None}, label=PLAIN)

    def request(op: str, precision: str, optimizer: str) -> ProbeRequest:
        return ProbeRequest(
            StepConfig(batch, precision, optimizer),
            RunConfig(budget, 600.0),
            min_steps=steps,
            max_steps=steps,
            op=op,
        )

    target = resolve_targets("cpu", MEMORY)[0]  # its lock: no tune's probes on this host meanwhile
    plain, twin = Probes(), Probes()
    with (
        RunLock.device(
            target.lock_key, target.label, command="python scripts/as_is_bench.py (fixed-cost probes)"
        ),
        ProbeClient(plain_spec.to_init(), list(PLAIN_ARGS), env=env) as plain_client,
        ProbeClient(str(ROOT / TWIN), [], env=env) as twin_client,
    ):
        for _ in range(samples):
            for client, req, into in (
                (plain_client, request("as_is", "script", "script"), plain),
                (twin_client, request("probe", "32-true", "adamw"), twin),
            ):
                outcome = client.run(req)
                if not outcome.fits or outcome.steps != steps:
                    raise SystemExit(f"a fixed-cost probe did not run its {steps} steps: {outcome.to_dict()}")
                into.walls.append(outcome.wall_seconds)
                into.steps.append(sum(outcome.step_seconds))
                into.setups.append(outcome.setup_seconds)
    return plain, twin


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="the fixed-cost probes' batch size")
    parser.add_argument("--steps", type=int, default=5, help="the fixed-cost probes' steps")
    parser.add_argument("--samples", type=int, default=3, help="fixed-cost probes of each script")
    parser.add_argument("--harness-steps", type=int, default=10, help="optimizer steps of a harness trial")
    parser.add_argument("--no-harness", action="store_true", help="skip the fresh-process harness")
    parser.add_argument("--output", type=Path, default=PAGE, help="the page the run is written to")
    args = parser.parse_args(argv)

    plain = tune(PLAIN, (), PLAIN_ARGS)
    print(f"plain loop: {plain.maximum} in {plain.probes} probes, {plain.wall:.1f} s", file=sys.stderr)
    twin = tune(TWIN, TWIN_OPTIONS, ())
    print(f"twin: {twin.maximum} in {twin.probes} probes, {twin.wall:.1f} s", file=sys.stderr)
    probes = fixed_costs(plain.budget, args.batch, args.steps, args.samples)
    truth: int | None = None
    if not args.no_harness:
        lo, hi = math.floor(plain.maximum * 0.9), math.ceil(plain.maximum * 1.05)
        truth = largest_fitting_as_is(PLAIN, PLAIN_ARGS, plain.budget, lo, hi, steps=args.harness_steps)
        print(f"harness: {truth} in [{lo}, {hi}]", file=sys.stderr)
    lines = [
        *measurements.run_header(measurements.command_line("as_is_bench.py", argv)),
        f"- both tunes: `--device cpu --memory {MEMORY} --no-cache`, budget {plain.budget / (1 << 20):.2f} MiB; "
        f"fixed-cost probes at batch {args.batch}, {args.steps} steps each, {args.samples} of each, alternating; "
        f"harness trials of {args.harness_steps} optimizer steps",
        "",
        *render(plain, twin, probes, truth),
    ]
    print("\n".join(lines))
    measurements.update(args.output, "runs", lines, title=TITLE, intro=INTRO)
    return 0


def render(plain: Tuned, twin: Tuned, probes: tuple[Probes, Probes], truth: int | None) -> list[str]:
    """The table, each fixed-cost probe's figures, and the verdict against the fresh process."""
    med = statistics.median

    def row(name: str, command: str, tuned: Tuned, timed: Probes, fresh: str, against: str) -> str:
        return (
            f"| {name} | `{command}` | {tuned.probes} | {tuned.wall:.1f} | {tuned.maximum} | {fresh} | {against} | "
            f"{med(timed.walls):.2f} | {med(timed.steps):.2f} | {med(timed.fixed):.2f} |"
        )

    share = (plain.maximum - truth) / truth if truth else None
    fresh, against = (str(truth), f"{share * 100:+.1f} %") if share is not None else ("-", "-")
    lines = [
        "| script | tune | probes | wall (s) | maximum | fresh process's maximum (harness) | against it "
        "| probe wall (s) | its steps (s) | fixed cost per probe (s) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        row(
            "plain loop, as it is",
            f"tune {PLAIN} -- {' '.join(PLAIN_ARGS)}",
            plain,
            probes[0],
            fresh,
            against,
        ),
        row("three-function twin", f"tune {TWIN} {' '.join(TWIN_OPTIONS)}", twin, probes[1], "-", "-"),
        "",
        "Probe wall, its steps and the fixed cost are medians of the fixed-cost probes. A probe's steps are timed "
        "by its step hooks: the plain loop's from the moment its script starts (the first includes the script's "
        "top level: its data set, model and DataLoader), the twin's around each step alone (its `build_model` and "
        "`make_batch` count in its fixed cost). Each probe, as wall − its steps = fixed (seconds), and the "
        "probe's `setup_seconds` (the budget and the device's hooks, before the script or the model):",
        "",
    ]
    for name, timed in (("plain loop", probes[0]), ("twin", probes[1])):
        each = ", ".join(
            f"{w:.2f} − {s:.2f} = {w - s:.2f}" for w, s in zip(timed.walls, timed.steps, strict=False)
        )
        lines.append(f"- {name}: {each} (setup {', '.join(f'{x:.3f}' for x in timed.setups)})")
    if share is not None:
        verdict = (
            "more than 1 % above it: it would not hold in the job's fresh process."
            if share > ABOVE
            else "it holds in the job's fresh process (not more than 1 % above it)."
        )
        lines += [
            "",
            f"The as-is maximum against the fresh process's: {plain.maximum} against {truth}, {share * 100:+.1f} %, "
            + verdict,
        ]
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
