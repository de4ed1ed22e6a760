#!/usr/bin/env python
"""Benchmark: autobatch against Lightning's and accelerate's batch-size finders on CPU-capped workloads.

For every workload, in one run and each in a fresh process under the SAME OS memory cap (RLIMIT_DATA at
autobatch's budget, memory x (1 - headroom), counting the whole process's VmData, imports included) and
the same pinned glibc allocator (MALLOC_ARENA_MAX=1, MALLOC_MMAP_THRESHOLD_=65536):

* ``autobatch tune`` on one combination (32-true, adamw, no recompute), and on the full default grid;
* ``autobatch-levels``: on a workload of repeated blocks, the default recomputation levels at 32-true/adamw
  under a global batch just above off's maximum, and each level's probes once off and full are known;
* Lightning's ``Tuner.scale_batch_size`` in ``binsearch`` and ``power`` mode (bench_workers.lightning_tuner);
* accelerate's ``find_executable_batch_size(starting_batch_size=4096)`` (bench_workers.accelerate_finder);

against the true maximum, bisected with fresh-process ``autobatch check --steps 10`` runs starting from
autobatch's answer (both sides verified), and checks whether each method's answer holds over 10 steps.
It also measures autobatch's probe overhead beyond the model's own build and steps. Each workload has a
fixed cap (``WORKLOADS``; ``--cap NAME=SIZE`` overrides it) chosen so that its true maximum is in the
tens to thousands and a step at the maximum takes about a second here; the model sizes are whatever the
files define at run time, and the table reports the measured true maximum, not an assumed one.

Usage (from the repository root, with the virtual environment active)::

    python scripts/benchmark.py            # all ten workloads, about 30 minutes on 2 quiet cores
    python scripts/benchmark.py --quick    # a subset
    python scripts/benchmark.py --workloads quadratic --methods autobatch,accelerate --output b.md

``--rounds N`` runs autobatch and Lightning's binsearch N times each, alternately, and the wall ratio takes
their medians; ``--data DIR`` keeps the raw results (every run's JSON, the checks' step peaks) as JSON.
Every tune takes a device lock of the benchmark's own, so that another user's tune on the machine is no
wait inside its wall.

Tables and the summaries against issue 14's and issue 33's targets are printed and written, headed by the command, the
date and the autobatch version, as the run's block of ``docs/measurements/benchmark.md`` (``--output``
for another page; the rest of the page is kept). Lightning and accelerate are benchmark extras, not autobatch's
runtime dependencies.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import measurements  # noqa: E402
from bench_workers import report, runs  # noqa: E402
from bench_workers.common import count_trials  # noqa: E402

from autobatch.devices.budget import margin_bytes  # noqa: E402

MiB = 1 << 20
PAGE = measurements.PAGES / "benchmark.md"
TITLE = "Benchmark: autobatch against Lightning and accelerate"

WORKLOADS = (
    runs.Workload("mlp", ROOT / "examples" / "mlp.py", memory=420 * MiB),
    runs.Workload("cnn", ROOT / "examples" / "cnn.py", memory=480 * MiB),
    runs.Workload("gpt", ROOT / "examples" / "gpt.py", memory=608 * MiB),
    runs.Workload("later_step_trap", ROOT / "tests" / "scripts" / "later_step_trap.py", memory=900 * MiB),
    runs.Workload("quadratic", ROOT / "tests" / "scripts" / "quadratic.py", memory=471 * MiB),
    # Issue 14's own: most of the peak is parameters and AdamW state; and a peak that is flat (the
    # optimizer step's) over most batch sizes before the forward and backward pass overtakes it.
    runs.Workload("param_heavy", ROOT / "scripts" / "workloads" / "param_heavy.py", memory=1 << 30),
    runs.Workload("flat_rising", ROOT / "scripts" / "workloads" / "flat_rising.py", memory=1 << 30),
    # Issue 33's: steps that cost (an LSTM; a small ViT, a patch convolution and six encoder layers), and the
    # example of the recomputation levels (24 blocks; autobatch-levels searches off, full, selective, partial).
    runs.Workload("lstm", ROOT / "examples" / "lstm.py", memory=640 * MiB),
    runs.Workload("vit_small", ROOT / "tests" / "scripts" / "vit_small.py", memory=768 * MiB),
    runs.Workload("text_classifier", ROOT / "examples" / "text_classifier.py", memory=420 * MiB, levels=True),
)
QUICK = ("later_step_trap", "quadratic")
EQUAL_ROOM = "(equal room)"
METHODS = (
    "autobatch",
    "autobatch-daemon",
    "autobatch-grid",
    "autobatch-levels",
    "lightning-binsearch",
    "lightning-power",
    "accelerate",
)
#: The methods run again, alternately, in every further round (--rounds): the wall ratio's two sides.
PAIRED = ("autobatch", "autobatch-daemon", "lightning-binsearch")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def trace_text(combo: dict[str, Any]) -> str:
    """A combination's probes, compactly: ``1 ok, 512 oom, 300 ok(10)``."""
    parts = []
    for p in combo.get("trace", []):
        mark = "ok" if p["kind"] == "fits" else p["kind"]
        parts.append(
            f"{p['batch_size']} {mark}" + (f"({p['steps']})" if p["steps"] > 3 and mark == "ok" else "")
        )
    return ", ".join(parts)


def levels_row(setup: runs.Setup, result: report.WorkloadResult) -> report.Row:
    """The default recomputation levels at 32-true/adamw under a global batch just above off's maximum (the
    smallest even one: two plans to choose between), and each level's probes once off and full are known."""
    single = result.row("autobatch")
    top = single.found if single and single.answered else None
    row = report.Row("autobatch-levels")
    if top is None:
        row.status, row.note = "error", "needs the autobatch row's maximum (run the autobatch method first)"
        return row
    target = top + 1 if (top + 1) % 2 == 0 else top + 2
    flags = ("--precision", "32-true", "--optimizer", "adamw", "--global-batch-size", str(target))
    run = runs.tune(setup, single=False, flags=flags, name="levels")
    row.wall, result.raw["tune-levels"] = run.wall, run.data
    if run.data is None:
        row.status, row.note = "error", run.error or "no result"
        return row
    combos = run.data["combinations"]
    row.found = next((c["max_batch_size"] for c in combos if c["recompute_level"] == "off"), None)
    for c in combos:
        purposes = [p.get("purpose") for p in c.get("trace", [])]
        timing = purposes.count("throughput")
        result.levels.append((c["recompute_level"], c["status"], len(purposes) - timing, timing))
    searched = [c for c in combos if c["status"] != "skipped"]
    row.probes = sum(c["probes"] for c in searched) / len(searched) if searched else None
    row.probes_note = f"per searched combination, global batch {target}"
    row.note = "; ".join(
        f"{level}: {status} in {search} + {timing} timing" for level, status, search, timing in result.levels
    )
    row.trace = [f"autobatch-levels {c['recompute_level']}: {trace_text(c)}" for c in combos]
    return row


def autobatch_row(
    setup: runs.Setup, single: bool, result: report.WorkloadResult, daemon: Path | None = None
) -> report.Row:
    """``daemon``: the one combination through the running daemon of that folder, after a first tune of the
    workload through it that is not counted (the daemon's spare fresh process and the script's warm parent
    and forked half are then what a second tune of the same script finds)."""
    method = "autobatch-daemon" if daemon is not None else "autobatch" if single else "autobatch-grid"
    key = "tune-daemon" if daemon is not None else f"tune-{'single' if single else 'grid'}"
    if daemon is not None and key not in result.raw:
        runs.tune(setup, single=single, daemon=daemon)
    run = runs.tune(setup, single=single, daemon=daemon)
    result.raw[key] = run.data
    row = report.Row(method, wall=run.wall)
    if run.data is None:
        row.status, row.note = "error", run.error or "no result"
        return row
    combos = run.data["combinations"]
    main = next(
        (
            c
            for c in combos
            if (c["precision"], c["optimizer"], c["recompute"]) == ("32-true", "adamw", False)
        ),
        None,
    )
    row.found = main["max_batch_size"] if main else None
    row.baseline_bytes = run.data["device"].get("baseline_bytes")
    tune_wall = run.data.get("wall_seconds")
    row.note = f"tune's own wall {tune_wall:.1f} s"
    if run.data.get("probe_overhead_seconds") is not None:
        row.note += f"; overhead it reports: {run.data['probe_overhead_seconds']:.3f} s per probe"
    row.verdicts = [(p["batch_size"], p["kind"] == "fits") for p in (main or {}).get("trace", [])]
    if single:
        row.probes = main["probes"] if main else None
        row.trace = [f"{method}: {trace_text(main)}"] if main else []
    else:
        searched = [c for c in combos if c["status"] != "skipped"]
        result.grid_combos, result.grid_probes = len(searched), sum(c["probes"] for c in combos)
        result.grid_timing = sum(1 for c in combos for p in c["trace"] if p.get("purpose") == "throughput")
        row.probes = result.grid_probes / len(searched) if searched else None
        row.probes_note = (
            f"per searched combination ({result.grid_probes} in all, {result.grid_timing} of them timing the "
            f"throughput choice; {len(searched)} of {len(combos)} combinations searched, the rest skipped)"
        )
        row.note += "; " + "; ".join(
            f"{c['precision']}/{c['optimizer']}/{'rc' if c['recompute'] else 'no-rc'}: "
            f"{c['status']} {c['max_batch_size']} in {c['probes']}"
            for c in combos
        )
        row.trace = [
            f"{method} {c['precision']}/{c['optimizer']}/{'recompute' if c['recompute'] else 'no-recompute'}: "
            f"{trace_text(c)}"
            for c in combos
        ]
    if row.found is None:
        row.status = "nothing"
    return row


def worker_row(
    setup: runs.Setup, method: str, label: str, options: dict[str, Any], result: report.WorkloadResult
) -> report.Row:
    module = "accelerate_finder" if method == "accelerate" else "lightning_tuner"
    run = runs.worker(setup, module, options)
    row = report.Row(label, wall=run.wall)
    record = run.data
    result.raw[label] = record
    if record is None:
        row.status, row.note = "crash", run.error or "no record"
        return row
    row.found, row.baseline_bytes = record["found"], record["baseline_bytes"]
    tried = record["tried"]
    row.probes = float(count_trials(tried))
    row.probes_note = f"({len(set(tried))} sizes)"
    row.status = "ok" if record["status"] == "ok" and (row.found or 0) >= 1 else record["status"]
    if row.status == "crash":
        row.found = tried[-1] if tried else None
    row.trace = [f"{row.method}: tried {', '.join(map(str, tried))}"]
    notes = []
    if record.get("error"):
        notes.append(f"error: {record['error'].splitlines()[0][:300]}")
    largest = record["extra"].get("largest_succeeded")
    if method == "lightning-binsearch" and largest is not None and largest != row.found:
        notes.append(f"{largest} before Lightning's 5 % margin")
    if options.get("reference_bytes"):
        notes.append(f"cap raised to {record['extra'].get('cap_bytes', 0) / MiB:.0f} MiB")
    row.note = "; ".join(notes)
    return row


def comparator_options(method: str, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    if method == "accelerate":
        return {"starting_batch_size": 4096, "steps": args.steps}
    return {
        "mode": method.split("-")[1],
        "steps_per_trial": args.steps,
        "max_trials": 50,
        "root": str(scratch),
    }


def bench_workload(workload: runs.Workload, args: argparse.Namespace, scratch: Path) -> report.WorkloadResult:
    reference = runs.probe_baseline(workload) if args.equal_room else None
    cap_note = (
        "" if reference is None else f"An autobatch probe starts at VmData {reference / report.MiB:.0f} MiB."
    )
    setup = runs.Setup(workload, workload.memory, args.headroom, scratch, args.timeout)
    result = report.WorkloadResult(setup, cap_note)
    for method in [m for m in METHODS if m in args.methods]:
        # Equal room for the comparators whose answer depends on the room (power mode only doubles).
        variants = (
            [("", None)]
            if method in ("autobatch", "autobatch-daemon", "autobatch-grid", "lightning-power")
            else [
                ("", None),
                (f" {EQUAL_ROOM}", reference),
            ]
        )
        for suffix, ref in variants if args.equal_room else variants[:1]:
            label = method + suffix
            if method == "autobatch-levels" and not workload.levels:
                continue
            log(f"{workload.name}: {label}")
            row = method_row(setup, method, label, ref, args, result)
            log(f"{workload.name}: {label} -> {row.found} ({row.status}) in {(row.wall or 0):.1f} s")
            result.rows.append(row)
    for round_ in range(2, args.rounds + 1):  # the wall ratio's two sides again, alternately
        for row in [r for r in result.rows if r.method in PAIRED]:
            log(f"{workload.name}: {row.method}, round {round_}")
            again = method_row(setup, row.method, row.method, None, args, result)
            if again.wall is not None:
                row.walls.append(again.wall)

    if args.truth:
        verify(result, args.check_with)
        log(f"{workload.name}: true maximum {result.truth} ({result.truth_note})")
    else:
        result.truth_note = "not bisected (--no-truth)"
    mine = result.row("autobatch")
    if args.fresh_check and mine is not None and mine.answered:
        log(f"{workload.name}: autobatch's {mine.found} in the job's fresh process")
        try:
            result.fresh = runs.fresh_check(setup, mine.found)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - the harness's failure is a finding, not the run's end
            result.fresh = {"error": str(exc)}
    if not args.no_overhead and result.truth:
        log(f"{workload.name}: probe overhead")
        try:
            result.overhead = runs.probe_overhead(setup, max(1, result.truth // 4))
        except RuntimeError as exc:
            result.truth_note += f"; overhead measurement failed: {exc}"
    return result


def method_row(
    setup: runs.Setup,
    method: str,
    label: str,
    reference: int | None,
    args: argparse.Namespace,
    result: report.WorkloadResult,
) -> report.Row:
    """One method's run on the workload, as a row of its table."""
    if method == "autobatch-levels":
        return levels_row(setup, result)
    if method.startswith("autobatch"):
        daemon = args.daemon if method == "autobatch-daemon" else None
        return autobatch_row(setup, method != "autobatch-grid", result, daemon)
    options = comparator_options(method, args, setup.scratch)
    options = {**options, "reference_bytes": reference} if reference else options
    return worker_row(setup, method, label, options, result)


def verify(result: report.WorkloadResult, mode: str) -> None:
    """The true maximum by fresh-process bisection from autobatch's answer, and holds? for every answer."""
    answers = [r.found for r in result.rows if r.answered]
    mine = result.row("autobatch")
    hint = mine.found if mine and mine.answered else (answers[0] if answers else 1)
    with runs.Checker(result.setup, mode=mode) as checker:
        try:
            top = runs.true_maximum(checker, hint, answers)  # type: ignore[arg-type]
            bisection = f"bisection: {len(checker.verdicts)} checks, " + ", ".join(
                f"{b} {'ok' if ok else 'oom'}" for b, ok in checker.verdicts.items()
            )
            if top is not None:
                result.truth = runs.stable_maximum(checker, top)
                checker.fits_again(top + 1)  # does the first size that failed fail again?
            result.truth_note = bisection
        except RuntimeError as exc:
            result.truth_note = f"bisection failed: {exc}"
        edge = sorted(b for b, seen in checker.history.items() if len(seen) > 1)
        if edge:
            result.truth_note += "; repeated: " + ", ".join(
                f"{b} {'/'.join('ok' if ok else 'oom' for ok in checker.history[b])}" for b in edge
            )
        flicker = [b for b, seen in checker.history.items() if len(set(seen)) > 1]
        if flicker:
            result.truth_note += f"; **the boundary flickers** at {', '.join(map(str, sorted(flicker)))}"
        if checker.marginal:
            result.truth_note += (
                f"; fitted the cap by less than the {margin_bytes('cpu', result.setup.budget) / MiB:g} MiB margin (counted as no fit): "
                + ", ".join(map(str, sorted(checker.marginal)))
            )
        result.truth_note += f"; {checker.seconds:.0f} s in all"
        result.check_peaks = checker.step_peaks
        if result.truth is not None:
            result.ties = {
                b for b in checker.marginal if b > result.truth and all(checker.cap_history.get(b, [False]))
            }
        for row in result.rows:
            if row.answered:
                try:
                    row.holds = checker.holds_under_cap(row.found)  # type: ignore[arg-type]
                except RuntimeError as exc:
                    row.note += f"; holds? check failed: {exc}"
    if checker.status_mismatches:
        result.truth_note += (
            "; `autobatch check`'s exit status disagreed with its JSON verdict: "
            + ", ".join(checker.status_mismatches)
        )


def save_data(folder: Path, results: list[report.WorkloadResult], figures: dict[str, Any]) -> None:
    """The raw results: per workload its runs' JSON, the true maximum and its checks; the summary's figures."""
    for r in results:
        record = {
            "cap_bytes": r.setup.memory,
            "true_max": r.truth,
            "truth_note": r.truth_note,
            "rows": [
                {k: v for k, v in vars(row).items() if k not in ("trace",)} | {"trace": row.trace}
                for row in r.rows
            ],
            "check_step_peaks": r.check_peaks,
            "fresh_check": r.fresh,
            "runs": r.raw,
        }
        measurements.write_data(
            folder / f"{r.setup.workload.name}.json", json.dumps(record, indent=1, default=str) + "\n"
        )
    measurements.write_data(folder / "summary.json", json.dumps(figures, indent=1, default=str) + "\n")


def header(argv: list[str], loads: tuple[float, float]) -> list[str]:
    """The run's header: command, date, versions, machine, and how the methods ran."""
    return measurements.run_header(
        measurements.command_line("benchmark.py", argv),
        extra=[
            f"- lightning {measurements.version('lightning')}, accelerate {measurements.version('accelerate')}",
            f"- load average (1 min) at start {loads[0]:.1f}, at end {loads[1]:.1f} (the benchmark itself keeps about "
            "one to two cores busy; anything above that is other work on the machine, which slows every method)",
            "- every method runs in a fresh process under the same RLIMIT_DATA (autobatch's budget, VmData of the "
            "whole process, imports included: the 'VmData at cap' column shows what each process held before its "
            "search) with MALLOC_ARENA_MAX=1 MALLOC_MMAP_THRESHOLD_=65536; AdamW, 32-true, "
            "3 steps per trial for Lightning and accelerate",
            f"- rows marked {EQUAL_ROOM} rerun Lightning's binsearch and accelerate with its cap raised by what its "
            "process held at the cap beyond what an autobatch probe starts with (Lightning imports about 80 MiB "
            "more): the same room for the workload, as on a GPU, where imports do not count; the wall-time targets "
            f"compare against Lightning's binsearch {EQUAL_ROOM} when it ran, since under the same cap it may not "
            "get to search at all",
            "- probes: autobatch's probes (its confirmation included); Lightning: trials; accelerate: "
            "calls of the function (restarts + 1); wall: the whole process, imports included",
        ],
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument(
        "--workloads", help="comma-separated workload names: " + ", ".join(w.name for w in WORKLOADS)
    )
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated: " + ", ".join(METHODS))
    parser.add_argument(
        "--cap", action="append", default=[], metavar="NAME=SIZE", help="fix a workload's cap"
    )
    parser.add_argument("--headroom", type=float, default=0.1)
    parser.add_argument(
        "--steps", type=int, default=3, help="steps per trial for Lightning and accelerate (>= 3)"
    )
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="seconds before any one process is killed"
    )
    parser.add_argument(
        "--no-equal-room",
        dest="equal_room",
        action="store_false",
        help="skip the second run of each comparator with its cap raised by what it imported beyond an autobatch probe",
    )
    parser.add_argument(
        "--check-with",
        choices=("client", "cli"),
        default="client",
        help="fresh-process 10-step checks through one autobatch probe server per workload (client, faster) "
        "or one `autobatch check` command each (cli)",
    )
    parser.add_argument("--no-overhead", action="store_true", help="skip the probe-overhead measurement")
    parser.add_argument(
        "--no-truth",
        dest="truth",
        action="store_false",
        help="skip the true maximum's bisection with forked 10-step checks and the holds? checks (the fresh-process "
        "check of autobatch's answer stays)",
    )
    parser.add_argument(
        "--no-fresh-check",
        dest="fresh_check",
        action="store_false",
        help="skip the independent check of autobatch's answer (and the next batch) in the job's fresh process",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help=f"run {' and '.join(PAIRED)} this many times each, alternately (the wall ratio takes the medians)",
    )
    parser.add_argument(
        "--data", type=Path, help="a folder for the raw results (every tune's JSON, the comparators' records)"
    )
    parser.add_argument(
        "--output", type=Path, default=PAGE, help="the page the run is written to (its block of the page)"
    )
    args = parser.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown or args.steps < 3:
        parser.error(f"unknown methods {unknown}" if unknown else "--steps must be at least 3")
    return args


def select(args: argparse.Namespace) -> list[runs.Workload]:
    from dataclasses import replace

    from autobatch.core.units import parse_size

    names = (
        args.workloads.split(",")
        if args.workloads
        else list(QUICK if args.quick else [w.name for w in WORKLOADS])
    )
    by_name = {w.name: w for w in WORKLOADS}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise SystemExit(f"unknown workloads {missing}; choose from {', '.join(by_name)}")
    caps = dict(item.split("=", 1) for item in args.cap)
    chosen = []
    for name in names:
        w = by_name[name]
        if name in caps:
            w = replace(w, memory=parse_size(caps[name]))
        chosen.append(w)
    return chosen


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    workloads = select(args)
    started, load_start = time.perf_counter(), os.getloadavg()[0]
    results = []
    with tempfile.TemporaryDirectory(prefix="autobatch-bench-") as scratch:
        args.daemon = Path(scratch) / "daemon"  # the benchmark's own daemon, running for autobatch-daemon
        if "autobatch-daemon" in args.methods:
            runs.daemon(args.daemon, "start")
        try:
            for workload in workloads:
                folder = Path(scratch) / workload.name
                folder.mkdir()
                result = bench_workload(workload, args, folder)
                results.append(result)
                print("\n".join(report.table(result)), flush=True)
        finally:
            if "autobatch-daemon" in args.methods:
                runs.daemon(args.daemon, "stop")
    lines, figures = report.summary(results)
    more, figures["probes_and_wall"] = report.probes_summary(results)
    lines += more
    elapsed = time.perf_counter() - started
    lines.append(f"Whole benchmark: {elapsed / 60:.1f} min.")
    if args.data is not None:
        save_data(args.data, results, figures)
    print("\n".join(lines), flush=True)
    document = (
        ["## Latest run", ""]
        + header(argv, (load_start, os.getloadavg()[0]))
        + [""]
        + [line for r in results for line in report.table(r)]
        + lines
    )
    measurements.update(args.output, "benchmark", document, title=TITLE)
    log(f"saved {measurements.shown(args.output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
