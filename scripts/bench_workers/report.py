"""The benchmark's tables and its summary against issue 14's targets (plain Markdown: printed and saved).

A :class:`Row` is one method on one workload; a :class:`WorkloadResult` holds a workload's rows, its
cap and its true maximum; :func:`summary` checks the targets over all workloads.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from autobatch.devices.budget import margin_bytes

from .runs import Overhead, Setup

MiB = 1 << 20


@dataclass
class Row:
    method: str
    found: int | None = None
    holds: bool | None = None
    probes: float | None = None
    probes_note: str = ""
    wall: float | None = None
    baseline_bytes: int | None = None
    status: str = "ok"  # ok | nothing | crash | error
    note: str = ""
    trace: list[str] = field(default_factory=list)  # the batch sizes tried, in order
    verdicts: list[tuple[int, bool]] = field(default_factory=list)  # autobatch: its probes at 32-true/adamw
    walls: list[float] = field(default_factory=list)  # further rounds' walls (--rounds)

    @property
    def median_wall(self) -> float | None:
        walls = [w for w in (self.wall, *self.walls) if w is not None]
        return statistics.median(walls) if walls else None

    @property
    def answered(self) -> bool:
        return self.status == "ok" and self.found is not None and self.found >= 1


@dataclass
class WorkloadResult:
    setup: Setup
    cap_note: str
    truth: int | None = None
    truth_note: str = ""
    # sizes above the truth that never ran out of memory under the cap but came within the margin in
    # some check: the margin line itself flickers there, so an answer among them is the maximum too
    ties: set[int] = field(default_factory=set)
    rows: list[Row] = field(default_factory=list)
    overhead: Overhead | None = None
    grid_combos: int = 0  # combinations the default grid searched (skipped ones excluded)
    grid_probes: int = 0
    grid_timing: int = (
        0  # of grid_probes, those that timed the throughput choice (no search, no confirmation)
    )
    levels: list[tuple[str, str, int, int]] = field(default_factory=list)  # level, status, search, timing
    check_peaks: list[list[int]] = field(default_factory=list)  # each fitting 10-step check's step peaks
    raw: dict[str, Any] = field(default_factory=dict)  # each run's JSON (tunes) or record (comparators)
    fresh: dict[str, Any] | None = None  # autobatch's answer in the job's fresh process (runs.fresh_check)

    def row(self, method: str) -> Row | None:
        return next((r for r in self.rows if r.method == method), None)


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _found(row: Row) -> str:
    if row.status in ("crash", "error"):
        return f"{row.status}" + (f" (at {row.found})" if row.found else "")
    if not row.answered:
        return "nothing" + (f" ({row.found})" if row.found is not None else "")
    return str(row.found)


def _versus(row: Row, truth: int | None, ties: set[int] | None = None) -> str:
    if not row.answered or truth is None:
        return "-"
    diff = row.found - truth  # type: ignore[operator]
    if diff and row.found in (ties or set()):
        return f"yes ({diff:+d}: at the margin line, never out of memory)"
    return "yes" if diff == 0 else f"{diff:+d} ({100 * diff / truth:+.1f} %)"


def _holds(row: Row) -> str:
    return "-" if row.holds is None else ("yes" if row.holds else "**no**")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(result: WorkloadResult) -> list[str]:
    s = result.setup
    w = s.workload
    args = f" `{' '.join(w.args)}`" if w.args else ""
    lines = [
        f"### {w.name}: `{w.script.name}`{args}",
        "",
        f"Cap {s.memory / MiB:.0f} MiB, headroom {s.headroom:g}: budget {s.budget / MiB:.1f} MiB "
        f"(RLIMIT_DATA, VmData of the whole process). {result.cap_note}",
        "True maximum (32-true, adamw, no recompute; the largest batch that fitted every fresh-process "
        f"10-step check run at it, 2 at least, with its peak at least the CPU margin ({margin_bytes('cpu', s.budget) / MiB:g} MiB) under the cap, "
        "tune's own criterion, bisected from autobatch's answer, with the next size failing): "
        f"**{result.truth if result.truth is not None else 'unknown'}** ({result.truth_note})",
        "",
        "| method | found | vs true max | holds? (10 steps, cap) | probes | wall (s) | VmData at cap | note |",
        "|---|---:|---|---|---:|---:|---:|---|",
    ]
    for row in result.rows:
        note = row.note
        if row.verdicts and result.truth is not None:
            against = [f"{b} {'ok' if ok else 'oom'}" for b, ok in row.verdicts if ok != (b <= result.truth)]
            if against:
                note += f"; its shorter probes that disagree with the 10-step checks: {', '.join(against)}"
        probes = _num(row.probes, 1 if row.probes is not None and row.probes % 1 else 0)
        lines.append(
            "| "
            + " | ".join(
                [
                    row.method,
                    _found(row),
                    _versus(row, result.truth, result.ties),
                    _holds(row),
                    probes + (f" {row.probes_note}" if row.probes_note else ""),
                    _num(row.wall)
                    + (f" (rounds: {', '.join(_num(w) for w in row.walls)})" if row.walls else ""),
                    "-" if row.baseline_bytes is None else f"{row.baseline_bytes / MiB:.0f} MiB",
                    _cell(note),
                ]
            )
            + " |"
        )
    if result.fresh is not None:
        lines += [
            "",
            "autobatch's answer and the next batch in the job's fresh process (no autobatch code, 10 steps, "
            f"`tests/harness/fresh_process.py`): {_fresh_text(result.fresh)}",
        ]
    traces = [line for row in result.rows for line in row.trace]
    if traces:
        lines += [
            "",
            "Batch sizes tried, in order (autobatch: each probe's verdict, (n) its steps when more than 3):",
            "",
        ]
        lines += [f"- {line}" for line in traces]
    if result.overhead is not None:
        o = result.overhead
        med = {k: statistics.median(p[k] for p in o.probes) for k in ("wall", "steps", "setup", "in_probe")}
        lines += [
            "",
            f"Probe overhead (ProbeClient, {len(o.probes)} probes of 3 steps at batch {o.batch_size}, medians): "
            f"**{o.median_overhead:.3f} s** beyond the model's build ({o.build_cold:.3f} s, timed cold in a fresh "
            f"process) and steps ({med['steps']:.2f} s) in a probe wall of {med['wall']:.2f} s. Of it: cap and "
            f"thread-pool start {med['setup']:.3f} s; fork, step bookkeeping, teardown and reaping "
            f"{med['in_probe'] - med['setup'] - med['steps'] - o.build_cold:.3f} s; the answer's trip to the "
            f"client {med['wall'] - med['in_probe']:.3f} s. One-time server start {o.server_start:.2f} s "
            f"(its imports: {o.import_seconds:.2f} s).",
        ]
    return lines + [""]


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("MET" if ok else "MISSED")


def summary(results: list[WorkloadResult]) -> tuple[list[str], dict[str, Any]]:
    """Issue 14's targets, measured: Markdown lines and the figures as data."""
    lines = ["## Summary against issue 14's targets", ""]
    figures: dict[str, Any] = {}

    exact = {r.setup.workload.name: _exact(r) for r in results}
    known = [v for v in exact.values() if v is not None]
    figures["exact"] = exact
    detail = ", ".join(f"{k}: {'yes' if v else 'no' if v is not None else 'n/a'}" for k, v in exact.items())
    lines.append(
        f"- autobatch's answer equals the true maximum on every workload: "
        f"**{_verdict(all(known) if known else None)}** ({detail})"
    )

    single = [r.row("autobatch") for r in results]
    probes = [row.probes for row in single if row and row.answered and row.probes is not None]
    median = statistics.median(probes) if probes else None
    figures["median_probes_single"] = median
    figures["max_probes_single"] = worst_probes = max(probes) if probes else None
    met = None if median is None or worst_probes is None else median <= 4 and worst_probes <= 8
    lines.append(
        f"- median probes per combination, one combination <= 4, none over 8: "
        f"**{_verdict(met)}** (median {_num(median)}, most {_num(worst_probes, 0)}; "
        + ", ".join(
            f"{r.setup.workload.name} {_num(row.probes, 0) if row else '-'}"
            for r, row in zip(results, single, strict=False)
        )
        + ")"
    )

    grids = {r.setup.workload.name: r for r in results if r.grid_combos}
    combos = sum(r.grid_combos for r in grids.values())
    average = sum(r.grid_probes for r in grids.values()) / combos if combos else None
    timing = sum(r.grid_timing for r in grids.values())
    searching = (sum(r.grid_probes for r in grids.values()) - timing) / combos if combos else None
    figures["grid_probes_per_combination"] = average
    figures["grid_search_probes_per_combination"] = searching
    lines.append(
        f"- full default grid averages <= 2.5 probes per combination: "
        f"**{_verdict(None if average is None else average <= 2.5)}** ({_num(average, 2)} over {combos} "
        f"searched combinations, {_num(searching, 2)} without the {timing} probes that timed the throughput "
        "choice; " + ", ".join(f"{k} {r.grid_probes}/{r.grid_combos}" for k, r in grids.items()) + ")"
    )

    for label, method, limit in (
        ("one combination", "autobatch", 0.5),
        ("one combination through a running daemon", "autobatch-daemon", 0.5),
        ("full default grid", "autobatch-grid", 2.0),
    ):
        ratios: dict[str, tuple[float, str]] = {}
        for r in results:
            mine = r.row(method)
            theirs = r.row("lightning-binsearch (equal room)") or r.row("lightning-binsearch")
            if mine and theirs and mine.wall and theirs.wall:
                why = [f"autobatch {mine.status}"] if mine.status != "ok" else []
                why += [f"Lightning {theirs.status}"] if theirs.status != "ok" else []
                ratios[r.setup.workload.name] = (mine.wall / theirs.wall, ", ".join(why))
        # A ratio only counts when autobatch answered: a quick failure is not a fast answer.
        ok = all(x <= limit and "autobatch" not in why for x, why in ratios.values()) if ratios else None
        figures[f"wall_ratio_{method}"] = {k: x for k, (x, _) in ratios.items()}
        detail = ", ".join(f"{k} {x:.2f}x" + (f" ({why})" if why else "") for k, (x, why) in ratios.items())
        lines.append(
            f"- wall time, {label} <= {limit:g}x Lightning binsearch's single combination: "
            f"**{_verdict(ok)}** ({detail})"
        )

    # Issue 14 reads "the full default grid at most 2x its single combination": autobatch's own, in the same run.
    own = {
        r.setup.workload.name: grid.wall / one.wall
        for r in results
        if (grid := r.row("autobatch-grid")) and (one := r.row("autobatch")) and grid.wall and one.wall
    }
    figures["wall_ratio_grid_to_single"] = own
    lines.append(
        f"- wall time, full default grid <= 2x autobatch's single combination: "
        f"**{_verdict(all(x <= 2.0 for x in own.values()) if own else None)}** ("
        + ", ".join(f"{k} {x:.2f}x" for k, x in own.items())
        + ")"
    )

    overheads = {r.setup.workload.name: r.overhead for r in results if r.overhead is not None}
    worst = max((o.median_overhead for o in overheads.values()), default=None)
    figures["probe_overhead"] = {k: o.median_overhead for k, o in overheads.items()}
    lines.append(
        f"- probe overhead on the CPU < 0.2 s beyond the model's own build and steps: "
        f"**{_verdict(None if worst is None else worst < 0.2)}** ("
        + ", ".join(f"{k} {o.median_overhead:.3f} s" for k, o in overheads.items())
        + "; one-time server start "
        + ", ".join(f"{k} {o.server_start:.2f} s" for k, o in overheads.items())
        + ")"
    )
    return lines + [""], figures


def _exact(result: WorkloadResult) -> bool | None:
    row = result.row("autobatch")
    if row is None or result.truth is None:
        return None
    return row.answered and (row.found == result.truth or row.found in result.ties)


def _last_growth(peaks: list[int], tolerance: int) -> int:
    """The last step whose peak rose by more than ``tolerance`` over the step before it (1: none did)."""
    return max((i + 1 for i in range(1, len(peaks)) if peaks[i] - peaks[i - 1] > tolerance), default=1)


def probes_summary(results: list[WorkloadResult]) -> tuple[list[str], dict[str, Any]]:
    """Issue 33's probe and wall targets, measured: Markdown lines and the figures as data."""
    from autobatch.core.step_peaks import growth_tolerance

    lines = ["## Probes and wall against issue 33's targets", ""]
    figures: dict[str, Any] = {}
    single = {r.setup.workload.name: r.row("autobatch") for r in results}
    counts = {
        k: int(row.probes) for k, row in single.items() if row and row.answered and row.probes is not None
    }
    figures["probes_single"] = counts
    spread: dict[int, list[str]] = {}
    for name, n in counts.items():
        spread.setdefault(n, []).append(name)
    median = statistics.median(counts.values()) if counts else None
    worst = max(counts.values()) if counts else None
    met = None if median is None or worst is None else median <= 4 and worst <= 6
    lines.append(
        f"- probes per combination (one combination, confirmation included): median <= 4, none over 6: "
        f"**{_verdict(met)}** (median {_num(median)}, most {_num(worst, 0)}; distribution: "
        + "; ".join(f"{n} probes: {', '.join(names)}" for n, names in sorted(spread.items()))
        + ")"
    )

    levels = [(r.setup.workload.name, lv) for r in results for lv in r.levels]
    later = [(name, lv) for name, lv in levels if lv[0] not in ("off", "full") and lv[1] != "skipped"]
    figures["levels"] = {
        f"{name} {lv[0]}": {"status": lv[1], "search": lv[2], "timing": lv[3]} for name, lv in levels
    }
    ok = all(search + timing <= 3 for _, (_, _, search, timing) in later) if later else None
    lines.append(
        "- the levels between off and full at most 3 probes each once off and full are known (search, "
        f"confirmation and timing): **{_verdict(ok)}** ("
        + ", ".join(f"{name} {lv[0]} {lv[2]} + {lv[3]} timing ({lv[1]})" for name, lv in later)
        + ")"
    )

    for method, figure, how in (
        ("autobatch", "wall_ratio", ""),
        (
            "autobatch-daemon",
            "wall_ratio_daemon",
            " through a running daemon (its second tune of the script)",
        ),
    ):
        ratios: dict[str, tuple[float, str]] = {}
        for r in results:
            mine, theirs = r.row(method), r.row("lightning-binsearch")
            if mine and theirs and mine.median_wall and theirs.median_wall:
                why = f"Lightning {theirs.status}" if theirs.status != "ok" else ""
                if not why and (theirs.found or 0) <= 1:  # its imports left no room for a search
                    why = "Lightning found 1"
                ratios[r.setup.workload.name] = (mine.median_wall / theirs.median_wall, why)
        if not ratios and method != "autobatch":
            continue
        figures[figure] = {k: x for k, (x, _) in ratios.items()}
        searched = {k: x for k, (x, why) in ratios.items() if not why}
        lines.append(
            f"- one combination's wall{how} at most 0.5x Lightning binsearch's, side by side (where Lightning "
            f"searched): **{_verdict(all(x <= 0.5 for x in searched.values()) if searched else None)}** ("
            + ", ".join(
                f"{k} {x:.2f}x" + (f" ({why}: not counted)" if why else "") for k, (x, why) in ratios.items()
            )
            + ")"
        )

    fresh = {r.setup.workload.name: r.fresh for r in results if r.fresh is not None}
    figures["fresh_check"] = fresh
    within = all(f.get("within") for f in fresh.values()) if fresh else None
    lines.append(
        "- no maximum further than the CPU margin from an independent check in the job's fresh process (no "
        "autobatch code; the answer fits 10 steps, the next batch does not or fits by less than the margin): "
        f"**{_verdict(within)}** (" + ", ".join(f"{k} {_fresh_text(f)}" for k, f in fresh.items()) + ")"
    )
    forked = {}
    for r in results:
        row = r.row("autobatch")
        if row is not None and row.answered and r.truth is not None:
            diff = row.found - r.truth  # type: ignore[operator]
            tie = row.found in r.ties
            forked[r.setup.workload.name] = "equal" if not diff else "margin tie" if tie else f"{diff:+d}"
    figures["against_forked_checks"] = forked
    lines.append(
        "- against the true maximum of the forked 10-step checks (forked from a probe server: not the job's "
        "fresh process, whose offset tune counts, so tune answers below them by the offset): "
        + ", ".join(f"{k} {v}" for k, v in forked.items())
    )

    settled: dict[str, int] = {}
    for r in results:
        tolerance = growth_tolerance(r.setup.budget)
        for peaks in r.check_peaks:
            step = _last_growth(peaks, tolerance)
            settled[r.setup.workload.name] = max(settled.get(r.setup.workload.name, 1), step)
    figures["last_growth_step"] = settled
    checks = sum(len(r.check_peaks) for r in results)
    lines.append(
        f"- the last step whose peak rose by more than the growth tolerance (max(1 MiB, budget / 1000)), over "
        f"the {checks} fitting 10-step checks (a confirmation runs 6 steps at least, then on while its peak "
        "grows): " + ", ".join(f"{k} step {v}" for k, v in settled.items())
    )
    return lines + [""], figures


def _fresh_text(fresh: dict[str, Any]) -> str:
    if "error" in fresh:
        return f"check failed: {fresh['error']}"
    parts = []
    for batch, trial in sorted(fresh["trials"].items(), key=lambda item: int(item[0])):
        peak = trial.get("peak_bytes")
        parts.append(f"{batch} {trial['kind']}" + (f" {peak / MiB:.1f} MiB" if peak else ""))
    return f"{'within' if fresh['within'] else '**outside**'} ({', '.join(parts)})"
