"""Sequence length as a dimension, measured: the maxima per length, checked, and a length the tune never saw.

For each attention of ``examples/transformer_lengths.py`` (``eager``: the ``(batch, heads, L, L)`` softmax
kept for backward; ``sdpa``: ``F.scaled_dot_product_attention``, which keeps none), on the CPU device under
one cap, every command a fresh ``autobatch`` (no cache), run from a folder of its own (no
``autobatch.toml`` adds to it):

1. ``tune --seq-len 128 --seq-len 256 --seq-len 512`` at 32-true, AdamW, no recomputation: per length the
   maximum and its probes; the fitted surface ``a + b·B·L + c·B·L²`` (its ``b``, ``c``, the ``L²`` share at
   the plan's length), its fit error and the token budget;
2. ``check --seq-len L`` at each length's maximum (it must fit) and at the maximum + 1 (out of memory, exit
   5; a batch that fits only inside the CPU margin, ``within_margin`` in its JSON, is noted as such);
3. the length no tune searched, 384: the surface's maximum there
   (:meth:`autobatch.core.lengths.Surface.max_batch`) against a tune at ``--seq-len 384`` alone.

Prints the tables and writes them, headed by the command, the date and the autobatch version, as a block
of ``docs/measurements/lengths.md`` (one for both attentions, one per attention run alone); each command's JSON goes to
``docs/measurements/data/lengths/``; ``--from DIR`` renders the JSON an earlier run left in DIR. About 20
minutes on 2 busy cores (load 3-6)::

    python scripts/lengths_bench.py
    python scripts/lengths_bench.py --attention sdpa --no-checks     # one attention, the tunes alone
"""

from __future__ import annotations

import argparse
import json
import os
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

from autobatch.core.lengths import Surface  # noqa: E402

PAGE = measurements.PAGES / "lengths.md"
RAW = measurements.DATA / "lengths"
TITLE = "Sequence lengths"
INTRO = (
    "The search over sequence lengths (see [Sequence lengths](../sequence-lengths.md)) on a small decoder "
    "whose attention either keeps its `(batch, heads, L, L)` scores for backward (`eager`) or does not "
    "(`sdpa`), measured with `python scripts/lengths_bench.py`: one tune over three lengths, each length's "
    "maximum and the next batch checked with `autobatch check --seq-len`, and a length the tune did not "
    "search (384) predicted from the fitted surface and measured by a tune of its own."
)
SCRIPT = "examples/transformer_lengths.py"
MEMORY = "1GiB"
LENGTHS = (128, 256, 512)
HELD_OUT = 384
ATTENTIONS = ("eager", "sdpa")
OPTIONS = ("--precision", "32-true", "--optimizer", "adamw", "--no-recompute", "--no-cache")
EXIT_OOM = 5
#: The prediction at the held-out length is good within this share of the measured maximum.
TARGET = 0.05


@dataclass
class Checked:
    """One ``check``: its exit status, whether it fitted only inside the CPU margin, its peak."""

    returncode: int
    within_margin: bool
    peak_bytes: int | None

    def verdict(self, expect_fit: bool) -> str:
        peak = f", peak {mib(self.peak_bytes)} MiB" if self.peak_bytes else ""
        if self.returncode == 0 and self.within_margin:
            return "fits only inside the CPU margin" + peak
        if self.returncode == 0:
            return ("fits" if expect_fit else "fits (the maximum is one short)") + peak
        if self.returncode == EXIT_OOM:
            return "out of memory" + (" (the maximum does not hold)" if expect_fit else "")
        return f"exit {self.returncode}"


@dataclass
class Length:
    seq_len: int
    status: str
    maximum: int | None
    probes: int
    slope: float | None = None  # the line's bytes per sample the surface is fitted to
    at_max: Checked | None = None
    above: Checked | None = None


@dataclass
class Run:
    """One attention's tune over the lengths, its checks and the held-out length."""

    attention: str
    lengths: list[Length]
    surface: dict[str, Any]
    fit_error: float | None
    token_budget: int | None
    line_bytes: int
    multiple: int
    plan: int
    seconds: dict[str, float] = field(default_factory=dict)
    predicted: int | None = None
    measured: Length | None = None

    @property
    def fitted(self) -> Surface:
        return Surface.from_dict(self.surface)

    @property
    def error(self) -> float | None:
        if self.predicted is None or self.measured is None or not self.measured.maximum:
            return None
        return (self.predicted - self.measured.maximum) / self.measured.maximum


class Commands:
    """The real command in a fresh process, from a folder of its own; every JSON kept under ``RAW``."""

    def __init__(self, folder: Path, raw: Path, replay: Path | None = None) -> None:
        self.folder, self.raw, self.replay = folder, raw, replay
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }

    def run(
        self, name: str, args: list[str], attention: str, ok: tuple[int, ...] = (0,)
    ) -> tuple[int, Any, float]:
        tail = ["--", "--attention", attention]
        command = [sys.executable, "-m", "autobatch", *args, "--json", *tail]
        shown = " ".join(["autobatch", *args, "--json", *tail]).replace(str(ROOT) + os.sep, "")
        print(f"$ {shown}", file=sys.stderr, flush=True)
        if self.replay is not None:  # an earlier run's JSON: its exit status from its verdict
            data = json.loads((self.replay / f"{name}.json").read_text())
            return (0 if data.get("fits", True) else EXIT_OOM), data, 0.0
        started = time.perf_counter()
        done = subprocess.run(command, cwd=self.folder, env=self.env, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if done.returncode not in ok:
            raise SystemExit(f"{shown}: exit {done.returncode}\n{done.stderr[-3000:]}")
        measurements.write_data(self.raw / f"{name}.json", done.stdout)
        return done.returncode, json.loads(done.stdout), seconds

    def tune(self, name: str, attention: str, lengths: tuple[int, ...]) -> tuple[dict[str, Any], float]:
        args = ["tune", str(ROOT / SCRIPT), "--device", "cpu", "--memory", MEMORY]
        args += [x for n in lengths for x in ("--seq-len", str(n))] + [*OPTIONS]
        args += ["--output", str(self.folder / f"{name}-result.json")]
        _, data, seconds = self.run(name, args, attention)
        return data, seconds

    def check(self, name: str, attention: str, batch: int, seq_len: int, steps: int | None) -> Checked:
        args = ["check", str(ROOT / SCRIPT), "--device", "cpu", "--memory", MEMORY, *OPTIONS[:-1]]
        args += ["--batch-size", str(batch), "--seq-len", str(seq_len)]
        args += ["--steps", str(steps)] if steps else []
        code, data, _ = self.run(name, args, attention, ok=(0, EXIT_OOM))
        return Checked(code, bool(data.get("within_margin")), data.get("peak_bytes"))


def lengths_of(table: dict[str, Any]) -> list[Length]:
    """The measured rows of a result's ``lengths`` table (one combination), by length."""
    rows = [r for r in table["maxima"] if r["status"] != "predicted"]
    return sorted(
        (
            Length(
                r["seq_len"],
                r["status"],
                r["max_batch_size"],
                int(r.get("probes") or 0),
                r.get("bytes_per_sample"),
            )
            for r in rows
        ),
        key=lambda row: row.seq_len,
    )


def measure(commands: Commands, attention: str, checks: bool, steps: int | None) -> Run:
    """Tune over the lengths, check each maximum and the next batch, and measure the held-out length."""
    data, seconds = commands.tune(f"tune-{attention}", attention, LENGTHS)
    table = data["lengths"]
    (surface,) = table["surfaces"]
    run = Run(
        attention, lengths_of(table), surface["surface"], surface.get("fit_error"), surface.get("token_budget"),
        int(table["line_bytes"]), int(table["batch_multiple"]), int(table["plan_seq_len"]),
    )  # fmt: skip
    run.seconds["tune"] = seconds
    print(f"{attention}: {[(x.seq_len, x.maximum, x.probes) for x in run.lengths]}", file=sys.stderr)
    for row in run.lengths if checks else ():
        if not row.maximum:
            continue
        name = f"check-{attention}-{row.seq_len}"
        row.at_max = commands.check(f"{name}-max", attention, row.maximum, row.seq_len, steps)
        row.above = commands.check(f"{name}-next", attention, row.maximum + 1, row.seq_len, steps)
    if surface["surface"] is not None:
        run.predicted = run.fitted.max_batch(HELD_OUT, run.line_bytes, run.multiple)
    held, seconds = commands.tune(f"tune-{attention}-{HELD_OUT}", attention, (HELD_OUT,))
    run.seconds[f"tune at {HELD_OUT}"] = seconds
    (combination,) = held["combinations"]
    run.measured = Length(
        HELD_OUT, combination["status"], combination["max_batch_size"], combination["probes"]
    )
    return run


def mib(value: float) -> str:
    return f"{value / 2**20:.2f}"


def pct(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else (f"{value * 100:+.1f} %" if signed else f"{value * 100:.1f} %")


def render(runs: list[Run]) -> list[str]:
    """The per-length table, the surfaces' table and the held-out length."""
    lines = [
        "| attention | tokens | max batch | probes | line's slope (MiB per sample) | check at max | check at max + 1 |",
        "| --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for run in runs:
        for row in run.lengths:
            at_max = row.at_max.verdict(True) if row.at_max else "-"
            above = row.above.verdict(False) if row.above else "-"
            maximum = row.maximum if row.maximum is not None else row.status
            slope = mib(row.slope) if row.slope else "-"
            lines.append(
                f"| {run.attention} | {row.seq_len} | {maximum} | {row.probes} | {slope} | {at_max} | {above} |"
            )
    lines += [
        "",
        f"| attention | a (MiB) | b (bytes per token) | c (bytes per token²) | L² share at {runs[0].plan} "
        f"| fit error | token budget | {HELD_OUT}: surface | {HELD_OUT}: measured (probes) | error |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in runs:
        s = run.surface
        share = run.fitted.attention_share(run.plan) if s else None
        held = run.measured
        measured = (
            f"{held.maximum} ({held.probes})" if held and held.maximum else (held.status if held else "-")
        )
        lines.append(
            f"| {run.attention} | {mib(s['intercept_bytes'])} | {s['bytes_per_token']:,.0f} | "
            f"{s['bytes_per_token_squared']:.2f} | {pct(share)} | {pct(run.fit_error)} | "
            f"{run.token_budget or '-':,} | {run.predicted} | {measured} | {pct(run.error, signed=True)} |"
        )
    lines += ["", *verdicts(runs)]
    return lines


def verdicts(runs: list[Run]) -> list[str]:
    """What the run shows against the targets, in words."""
    out = []
    for run in runs:
        error = run.error
        if error is not None:
            within = "within" if abs(error) <= TARGET else "NOT within"
            out.append(
                f"- {run.attention}: the surface's maximum at {HELD_OUT} tokens is {run.predicted} against "
                f"{run.measured.maximum if run.measured else '-'} measured, {pct(error, signed=True)}: "
                f"{within} the {TARGET:.0%} target."
            )
        further = [row.probes for row in run.lengths if row.seq_len != run.plan]
        out.append(
            f"- {run.attention}: probes at the plan's {run.plan} tokens "
            f"{sum(r.probes for r in run.lengths if r.seq_len == run.plan)}, at each further length {further}; "
            f"tune {run.seconds.get('tune', 0):.0f} s, the tune at {HELD_OUT} alone "
            f"{run.seconds.get(f'tune at {HELD_OUT}', 0):.0f} s."
        )
    by = {run.attention: run for run in runs}
    if {"eager", "sdpa"} <= by.keys() and by["eager"].surface["bytes_per_token_squared"] > 0:
        eager, sdpa = (by[a].surface["bytes_per_token_squared"] for a in ("eager", "sdpa"))
        out.append(f"- sdpa's c against eager's: {sdpa:.2f} / {eager:.2f} = {sdpa / eager:.3f}.")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attention", choices=ATTENTIONS, action="append", help="one attention (repeatable)")
    parser.add_argument("--no-checks", action="store_true", help="skip the checks at each maximum")
    parser.add_argument("--check-steps", type=int, help="steps of each check (default: check's own)")
    parser.add_argument("--output", type=Path, default=PAGE, help="the page the run is written to")
    parser.add_argument("--from", dest="replay", type=Path, help="render the JSON an earlier run left there")
    args = parser.parse_args(argv)
    attentions = args.attention or list(ATTENTIONS)
    log: dict[str, Any] = {
        "command": measurements.command_line("lengths_bench.py", argv),
        "date": measurements.now(),
        "load_start": os.getloadavg()[0],
    }
    runs = []
    with tempfile.TemporaryDirectory() as folder:
        commands = Commands(Path(folder), RAW, args.replay)
        for attention in attentions:
            runs.append(measure(commands, attention, not args.no_checks, args.check_steps))
    log["load_end"] = os.getloadavg()[0]
    log["seconds"] = {run.attention: run.seconds for run in runs}
    if args.replay is not None:  # the run's own command, date, load and times
        log = json.loads((args.replay / "log.json").read_text())
        for run in runs:
            run.seconds = log["seconds"].get(run.attention, {})
    else:
        measurements.write_data(RAW / "log.json", json.dumps(log, indent=2) + "\n")
    lines = [*header(log, runs[0].line_bytes), "", *render(runs)]
    print("\n".join(lines))
    key = "runs" if len(attentions) == len(ATTENTIONS) else "-".join(attentions)
    measurements.update(args.output, key, lines, title=TITLE, intro=INTRO)
    return 0


def header(log: dict[str, Any], line_bytes: int) -> list[str]:
    """The run's command, date, versions and machine, the tune's command and the machine's load."""
    tune = (
        f"`autobatch tune {SCRIPT} --device cpu --memory {MEMORY} "
        + " ".join(f"--seq-len {n}" for n in LENGTHS)
        + f" {' '.join(OPTIONS)} --json -- --attention ATTENTION`"
    )
    extra = [
        f"- each attention's tune: {tune}, run from an empty folder; the checks at 32-true, AdamW, no "
        "recomputation with `--batch-size B --seq-len L`",
        f"- line (the budget less the CPU margin): {mib(line_bytes)} MiB; load average (1 min) at start "
        f"{log['load_start']:.1f}, at end {log['load_end']:.1f} (the machine is shared: anything above 1-2 is "
        "other work, which slows the steps, not their memory)",
    ]
    return measurements.run_header(log["command"], date=log["date"], extra=extra)


if __name__ == "__main__":
    raise SystemExit(main())
