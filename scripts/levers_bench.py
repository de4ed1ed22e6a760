"""Recomputation levels and compile, measured: which level a global batch just above off's maximum needs, and
what each plan costs per global batch, side by side.

On ``examples/text_classifier.py`` (CPU device, 420 MiB, 32-true, AdamW), every command a fresh ``autobatch``
run from a folder of its own (no ``autobatch.toml`` adds to it):

1. ``tune --objective max-batch --exact-all`` at off, full and selective: each level's exact maximum;
2. G, the smallest even batch above off's maximum (off plans it as G/2 x 2), and ``tune --global-batch-size G``
   with the default grid (off, full, selective, partial) and no cache: the choice, each level's maximum and
   status, its probes (search and confirmation apart from timing), and its seconds per global batch as the
   tune's timing probes measured them;
3. the plans side by side, interleaved (A B C D, A B C D, ...) for ``--rounds`` rounds, as a job runs them:
   this script's ``--job`` loop in a fresh process runs the micro-batches' forward and backward, then ONE
   optimizer step. Off at G/2 x 2, the partial level the tune resolved at G x 1, full at G x 1 (the same
   plan), selective at G x 1 when it fits. Under glibc's default allocator (the job's) and under the probes'
   pinned one (``MALLOC_ARENA_MAX=1 MALLOC_MMAP_THRESHOLD_=65536``), which is why timing probes switch to the
   job's;
4. compile, on ``examples/mlp.py`` and ``examples/gpt.py`` made small under 640 MiB: a tune with compile both
   (an empty inductor cache): maxima, probes, compile seconds, seconds per step.

The job's loops run under OpenMP's default wait policy, as a job and the tune's probes on a quiet machine do:
run it on a quiet machine (the page records the load average). Prints the tables and writes them, headed by the command, the date and the autobatch version,
as a block of ``docs/measurements/levers.md``; each command's JSON goes to ``docs/measurements/data/levers/``.
About 15 minutes on 2 cores::

    python scripts/levers_bench.py
    python scripts/levers_bench.py --rounds 5 --steps 8 --no-compile
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import measurements  # noqa: E402

PAGE = measurements.PAGES / "levers.md"
RAW = measurements.DATA / "levers"
TITLE = "Recomputation levels and compile"
INTRO = (
    "The levels between recomputation off and full, and compile (see [Recomputation levels and "
    "compile](../levers.md)), measured with `python scripts/levers_bench.py` on `examples/text_classifier.py`: "
    "the maxima per level, the throughput choice under a global batch just above off's maximum, and the plans "
    "it chose between, timed side by side in one run as a job runs them; then `torch.compile` on "
    "`examples/mlp.py` and `examples/gpt.py`."
)
SCRIPT = "examples/text_classifier.py"
OPTIONS = ("--device", "cpu", "--memory", "420MiB", "--precision", "32-true", "--optimizer", "adamw")
COMPILE_OPTIONS = ("--device", "cpu", "--memory", "640MiB", "-p", "32-true", "-o", "adamw", "--no-recompute")
#: (script, batch multiple, its arguments) of the compile part: small enough to compile in seconds.
COMPILED = (
    (
        "examples/mlp.py",
        "64",
        ("--", "--width", "64", "--depth", "2", "--tokens", "64", "--in-features", "64"),
    ),
    ("examples/gpt.py", "8", ("--", "--depth", "2", "--width", "64", "--seq-len", "32", "--vocab", "512")),
)


@dataclass
class Plan:
    """One plan of the global batch, and its timings per round (seconds per global batch)."""

    name: str
    level: str
    micro: int
    accumulation: int
    tuned: float | None = None  # seconds per global batch, as the tune's timing probes measured it
    job: list[float] = field(default_factory=list)  # the job's loop: micro-batches, then one optimizer step
    pinned: list[float] = field(default_factory=list)  # the same loop under the probes' pinned allocator


class Commands:
    """The real command in a fresh process, from a folder of its own; every JSON kept under ``RAW``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        self.env = {**os.environ, "PYTHONPATH": path, "AUTOBATCH_CACHE_DIR": str(folder / "cache")}

    def run(self, name: str, args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
        command = [sys.executable, "-m", "autobatch", *args]
        print("$ " + measurements.scrub(" ".join(["autobatch", *args])), file=sys.stderr, flush=True)
        done = subprocess.run(
            command, cwd=self.folder, env={**self.env, **(env or {})}, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr[-3000:]}")
        measurements.write_data(RAW / f"{name}.json", done.stdout)
        return json.loads(done.stdout)

    def tune(
        self, name: str, script: str, *options: str, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        out = str(self.folder / f"{name}-result.json")
        return self.run(name, ["tune", str(ROOT / script), "--json", "--output", out, *options], env)

    def check(
        self, name: str, script: str, *options: str, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        return self.run(name, ["check", str(ROOT / script), "--json", *options], env)


def levels(*names: str) -> list[str]:
    return [arg for name in names for arg in ("--recompute-level", name)]


def by_level(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["recompute_level"]: c for c in data["combinations"]}


def job_loop(level: str, micro: int, accumulation: int, batches: int) -> list[float]:
    """Seconds per global batch of the job's loop: ``accumulation`` micro-batches of forward and backward, then
    one optimizer step (run in a fresh process: ``--job``)."""
    import importlib.util

    import torch

    from autobatch.step.recompute import wrap_recompute

    spec = importlib.util.spec_from_file_location("levers_example", ROOT / SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.argv = [str(ROOT / SCRIPT)]
    spec.loader.exec_module(module)
    model = module.build_model()
    if level != "off":
        wrap_recompute(model, tuple(module.RECOMPUTE_CLASSES), level)
    optimizer = torch.optim.AdamW(model.parameters())
    batch = module.make_batch(micro)
    seconds = []
    for _ in range(batches + 1):  # the first allocates the optimizer's state: not counted
        started = time.perf_counter()
        for _ in range(accumulation):
            (module.compute_loss(model, batch) / accumulation).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - started)
    return seconds[1:]


def run_job(plan: Plan, batches: int, probes_allocator: bool) -> float:
    """The median of :func:`job_loop` in a fresh process, under the probes' allocator settings or glibc's."""
    from autobatch.devices.cpu import MALLOC_ENV

    args = [plan.level, str(plan.micro), str(plan.accumulation), str(batches)]
    env = {k: v for k, v in os.environ.items() if k not in MALLOC_ENV}
    env.pop("OMP_WAIT_POLICY", None)  # as the job and the tune's probes on a quiet machine: OpenMP's default
    env.update(MALLOC_ENV if probes_allocator else {})
    done = subprocess.run(
        [sys.executable, __file__, "--job", *args], env=env, capture_output=True, text=True, check=True
    )
    return statistics.median(json.loads(done.stdout))


def side_by_side(plans: list[Plan], rounds: int, steps: int) -> None:
    """Every plan timed as the job runs it, under both allocators, in every round, interleaved."""
    for _ in range(rounds):
        for plan in plans:
            plan.job.append(run_job(plan, steps, probes_allocator=False))
            plan.pinned.append(run_job(plan, steps, probes_allocator=True))
            print(f"{plan.name}: job {plan.job[-1]:.3f} s, pinned {plan.pinned[-1]:.3f} s", file=sys.stderr)


def compile_part(commands: Commands) -> list[dict[str, Any]]:
    """Per script: one tune with compile both (an empty inductor cache), and check --compile at the maximum."""
    out = []
    for script, multiple, arguments in COMPILED:
        name = Path(script).stem
        env = {
            "AUTOBATCH_COMPILE": "both",
            "AUTOBATCH_INDUCTOR_CACHE": str(commands.folder / f"inductor-{name}"),
        }
        options = (
            *COMPILE_OPTIONS,
            "--batch-multiple",
            multiple,
            "--objective",
            "max-batch",
            "--exact-all",
            "--no-cache",
        )
        started = time.perf_counter()
        data = commands.tune(f"compile-{name}", script, *options, *arguments, env=env)
        part: dict[str, Any] = {"script": script, "seconds": time.perf_counter() - started, "combos": {}}
        for combo in data["combinations"]:
            keys = ("max_batch_size", "probes", "compile_seconds", "status", "samples_per_second")
            part["combos"][bool(combo.get("compile"))] = {key: combo.get(key) for key in keys}
        compiled = part["combos"][True]
        at = (*COMPILE_OPTIONS, "-b", str(compiled["max_batch_size"]), "--compile", *arguments)
        part["check"] = commands.check(f"compile-{name}-check", script, *at, env=env)["fits"]
        out.append(part)
    return out


def measure(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """The maxima, the throughput tune, the plans side by side, and compile."""
    commands = Commands(folder)
    grid = levels("off", "full", "selective")
    exact = by_level(
        commands.tune("maxima", SCRIPT, *OPTIONS, "--objective", "max-batch", "--exact-all", *grid)
    )
    off = exact["off"]["max_batch_size"]
    target = off + 1 + (off + 1) % 2
    started = time.perf_counter()
    tuned = commands.tune("throughput", SCRIPT, *OPTIONS, "--global-batch-size", str(target), "--no-cache")
    seconds = time.perf_counter() - started
    combos = by_level(tuned)
    partial = next(level for level in combos if "/" in level)
    plans = [
        Plan("off", "off", target // 2, 2),
        Plan(partial, partial, target, 1),
        Plan("full", "full", target, 1),
    ]
    if exact["selective"]["max_batch_size"] >= target:
        plans.append(Plan("selective", "selective", target, 1))
    for plan in plans:
        plan.tuned = combos[plan.level].get("global_batch_seconds")
    side_by_side(plans, args.rounds, args.steps)
    run = {"target": target, "exact": exact, "tuned": tuned, "tune_seconds": seconds, "plans": plans}
    run["compile"] = None if args.no_compile else compile_part(commands)
    return run


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def searched(combo: dict[str, Any]) -> tuple[int, int]:
    """(search and confirmation probes, timing probes) of a combination's trace."""
    timing = sum(1 for t in combo["trace"] if t["purpose"] == "throughput")
    return len(combo["trace"]) - timing, timing


def render_levels(run: dict[str, Any]) -> list[str]:
    tuned = by_level(run["tuned"])
    order = ["off", *(level for level in tuned if "/" in level), "selective", "full"]
    lines = [
        f"| level | exact maximum (max-batch tune) | throughput tune at G = {run['target']}: status | maximum "
        "| probes: search and confirmation | probes: timing | samples/s |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for level in order:
        combo, exact = tuned.get(level), run["exact"].get(level)
        if combo is None:
            continue
        search, timing = searched(combo)
        rate = f"{combo['samples_per_second']:.1f}" if combo.get("samples_per_second") else "-"
        lines.append(
            f"| {level} | {exact['max_batch_size'] if exact else '-'} | {combo['status']} | "
            f"{combo['max_batch_size']} | {search} | {timing} | {rate} |"
        )
    chosen = run["tuned"]["chosen"]
    lines += [
        "",
        f"Chosen: `{chosen['recompute_level']}`, micro-batch {chosen['micro_batch_size']} x accumulation "
        f"{chosen['accumulation_steps']}, {chosen.get('decided_by')}; the tune took {run['tune_seconds']:.0f} s "
        f"and {run['tuned']['probes']} probes. Its notes:",
        "",
        *(f"- {note}" for note in run["tuned"]["notes"] if "not chosen" in note or "busy" in note),
    ]
    return lines


def render_plans(plans: list[Plan]) -> list[str]:
    partial = plans[1]  # the partial level the tune resolved

    def cell(plan: Plan, values: str) -> str:
        mine, theirs = med(getattr(plan, values)), med(getattr(partial, values))
        return f"{mine:.3f} ({mine / theirs - 1:+.1%})"

    lines = [
        "| plan | micro-batch x accumulation | the tune's timing probes | the job's loop (glibc's allocator) "
        "| the job's loop under the probes' pinned allocator |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for plan in plans:
        tuned = f"{plan.tuned:.3f}" if plan.tuned else "- (not timed: dominated)"
        cells = " | ".join(cell(plan, values) for values in ("job", "pinned"))
        lines.append(f"| {plan.name} | {plan.micro} x {plan.accumulation} | {tuned} | {cells} |")
    lines += [
        "",
        "Seconds per global batch: the tune's own figure (accumulation x the step less its update, plus one "
        "update), then medians over the rounds of the job's loop (in brackets: against the partial level). "
        "Each round, in the order run (glibc's / pinned):",
        "",
    ]
    for plan in plans:
        each = ", ".join(f"{j:.3f} / {p:.3f}" for j, p in zip(plan.job, plan.pinned, strict=False))
        lines.append(f"- {plan.name}: {each}")
    return lines


def render_compile(parts: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| script | torch.compile | maximum | probes | compile seconds | samples/s | `check --compile` at the maximum |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for part in parts:
        for flag in (False, True):
            combo = part["combos"][flag]
            compiled = f"{combo['compile_seconds']:.1f}" if combo.get("compile_seconds") else "-"
            rate = f"{combo['samples_per_second']:,.0f}" if combo.get("samples_per_second") else "-"
            check = ("fits" if part["check"] else "DOES NOT FIT") if flag else ""
            lines.append(
                f"| `{part['script']}` | {'on' if flag else 'off'} | {combo['max_batch_size']} ({combo['status']}) "
                f"| {combo['probes']} | {compiled} | {rate} | {check} |"
            )
    lines += [
        "",
        "Each tune (both combinations, an empty inductor cache): "
        + ", ".join(f"`{p['script']}` {p['seconds']:.0f} s" for p in parts)
        + ".",
    ]
    return lines


def verdicts(run: dict[str, Any]) -> list[str]:
    chosen, plans = run["tuned"]["chosen"], run["plans"]
    level = chosen["recompute_level"]
    partial, off, full = plans[1], plans[0], plans[2]
    exact = {k: v["max_batch_size"] for k, v in run["exact"].items()}
    search = searched(by_level(run["tuned"])[partial.level])[0]
    out = [
        f"- partial chosen: {'yes' if '/' in level and chosen['accumulation_steps'] == 1 else 'NO'} (`{level}`, "
        f"{chosen['micro_batch_size']} x {chosen['accumulation_steps']}).",
        f"- {partial.name} against full at the same plan, in the job's loop: {med(partial.job):.3f} s against "
        f"{med(full.job):.3f} s per global batch ({'lower' if med(partial.job) < med(full.job) else 'NOT lower'}); "
        f"against off's {off.micro} x 2: {med(off.job):.3f} s "
        f"({'lower' if med(partial.job) < med(off.job) else 'NOT lower'}).",
        f"- selective between off and full: {exact['off']} < {exact['selective']} < {exact['full']}: "
        f"{'yes' if exact['off'] < exact['selective'] < exact['full'] else 'NO'}.",
        f"- the partial level's probes besides timing: {search} ({'at most 3' if search <= 3 else 'MORE than 3'}).",
    ]
    for part in run["compile"] or []:
        states = {c["status"] for c in part["combos"].values()}
        done = states <= {"exact", "capped"} and part["check"]
        out.append(
            f"- compile of `{part['script']}` finished and its maximum held: {'yes' if done else 'NO'}."
        )
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the side-by-side timings")
    parser.add_argument("--steps", type=int, default=8, help="global batches of each job's loop")
    parser.add_argument("--no-compile", action="store_true", help="skip the compile part")
    parser.add_argument("--output", type=Path, default=PAGE, help="the page the run is written to")
    parser.add_argument("--job", nargs=4, help=argparse.SUPPRESS)  # LEVEL MICRO ACCUMULATION BATCHES
    args = parser.parse_args(argv)
    if args.job:
        level, micro, accumulation, batches = args.job
        print(json.dumps(job_loop(level, int(micro), int(accumulation), int(batches))))
        return 0
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        run = measure(args, Path(folder))
    log = {"plans": [vars(p) for p in run["plans"]], "compile": run["compile"], "target": run["target"]}
    measurements.write_data(RAW / "log.json", json.dumps(log, indent=2, default=str) + "\n")
    lines = [
        *measurements.run_header(measurements.command_line("levers_bench.py", argv)),
        f"- `{SCRIPT}` {' '.join(OPTIONS)}; G = {run['target']}, the smallest even batch above off's maximum; "
        f"{args.rounds} rounds of the plans, each the job's loop over {args.steps} global batches in a fresh "
        f"process; compile: {'; '.join(f'`{s} {chr(32).join(a[1:])}`' for s, _, a in COMPILED)} under "
        f"{' '.join(COMPILE_OPTIONS)}",
        f"- load average (1 min) at start {load:.1f}, at end {os.getloadavg()[0]:.1f} (the machine is shared)",
        "",
        *render_levels(run),
        "",
        *render_plans(run["plans"]),
        "",
        *(render_compile(run["compile"]) + [""] if run["compile"] else []),
        *verdicts(run),
    ]
    print("\n".join(lines))
    measurements.update(args.output, "runs", lines, title=TITLE, intro=INTRO)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
