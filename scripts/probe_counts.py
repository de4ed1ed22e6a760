"""Probes per curve family for the per-combination procedure (pure: fake probes, seconds).

``python scripts/probe_counts.py`` prints, per synthetic curve, the probes ``find_maximum`` makes
(confirmation included) and whether the answer is the true maximum; then the same for the grid's second
combination, primed by the first one's line through :mod:`autobatch.core.reuse`. Run it before and after
a change to the search: each idea is measured before it goes in. The output also goes, headed by the
command, the date and the autobatch version, to ``docs/measurements/probe-counts.md``.

Besides the synthetic families, the measured quadratic curve follows real tunes of
``tests/scripts/quadratic.py`` (CPU, 471 MiB, 2026-11-29; a miss past the cap fails its first allocation,
with no peak), and two curves a real tune (``scripts/workloads/param_heavy.py``, CPU,
1 GiB cap, 2026-11-23): the rising phase's reading (``first_backward_peak`` + optimizer state) is not
affine (0.25 MiB per sample under batch 340, where the gradients and the build set it, 0.53 above), the
step's peak is flat (the optimizer step's) until batch ~540, a 10-step probe peaks ~0.3 MiB above a
3-step one (so batch 642 fits 3 steps and fails 10), and at bf16-mixed the step's peak lies 8.3 MiB
above the rising reading (an autocast cache the reading misses).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import statistics
import sys
from dataclasses import dataclass

import measurements

from autobatch.core.maximum import Limits, find_maximum
from autobatch.core.model import Affine
from autobatch.core.reuse import Learned, Prediction, predict
from autobatch.core.space import Combo
from autobatch.devices.budget import margin_bytes
from autobatch.testing import (
    Curve,
    FakeStepProbe,
    ProcessNoise,
    affine,
    noisy,
    plateau,
    quadratic,
    staircase,
    true_max,
)

GiB, MiB = 2**30, 2**20
LIMITS = Limits(max_batch_size=65536, batch_multiple=1, steps=3, max_steps=8, confirm_steps=10)


@dataclass(frozen=True)
class Measured(Curve):
    """A curve from a real tune (MiB): ``total`` the 3-step peak, ``long`` the 10-step one (it decides a
    confirmation), ``rise`` the rising phase's reading; each piecewise ``max`` of lines ``(a, k)``."""

    total: tuple[tuple[float, float], ...]
    long: tuple[tuple[float, float], ...]
    rise: tuple[tuple[float, float], ...]

    def __call__(self, batch_size: int) -> int:
        return _lines(self.total, batch_size)

    def rising(self, batch_size: int) -> int:
        return _lines(self.rise, batch_size)

    def fails_long(self, batch_size: int, budget: int) -> bool:
        return _lines(self.long, batch_size) > budget


def _lines(lines: tuple[tuple[float, float], ...], b: int) -> int:
    return math.ceil(max(a + k * b for a, k in lines) * MiB)


#: The line the model aims at there: budget 921.6 MiB less the CPU margin (1 MiB when these were measured).
PH_BUDGET = int(921.6 * MiB) - margin_bytes("cpu", int(921.6 * MiB))
PARAM_HEAVY = Measured(
    total=((866.82, 0.0), (579.33, 0.5315)),
    long=((866.82, 0.0), (579.6, 0.5315)),
    rise=((674.8, 0.25), (579.2, 0.5315)),
)
PARAM_HEAVY_BF16 = Measured(
    total=((876.0, 0.0), (580.45 + 8.31, 0.3905)),
    long=((876.0, 0.0), (580.45 + 8.67, 0.3905)),
    rise=((642.0, 0.3164), (580.45, 0.3905)),
)
#: ``scripts/workloads/flat_rising.py`` the same way: a rising reading near-affine (0.754 MiB per sample)
#: above the flat optimizer step's peak; batch 328 fits the cap by less than the margin.
FLAT_RISING = Measured(
    total=((866.05, 0.0), (673.94, 0.7542)),
    long=((866.05, 0.0), (673.94, 0.7542)),
    rise=((673.98, 0.7542),),
)
#: baseline 290 MiB + parameters 96 MiB + AdamW's two states 192 MiB (the tuner's floor).
PH_FLOOR = (290 + 96 + 192) * MiB
#: What a probe measures as static (its own baseline, parameters, gradients, AdamW's state: 682.2 MiB on
#: both workloads, 2026-11-25), placed under each curve as the real probes' readings at batch 8 lay above
#: it: 6.0 MiB (flat_rising), 6.6 MiB (param_heavy). The curves were measured in another session, with
#: a baseline 8 MiB lower.
FLAT_STATIC = int((673.98 + 0.7542 * 8 - 5.96) * MiB)
PH_STATIC = int((674.8 + 0.25 * 8 - 6.6) * MiB)
PH_STATE = int(192.26 * MiB)
#: The embedding table, the 512 -> 64 layer and the 16-class head: 25.2 M parameters.
PH_SHAPES = [(49152, 512), (64, 512), (64,), (16, 64), (16,)]

#: ``tests/scripts/quadratic.py`` (a batch x batch contrastive loss) under 471 MiB with 10 % headroom, CPU,
#: 2026-11-29: the quadratic through its fits' peaks, the search's line 3 MiB under the cap, the floor and the
#: static memory its probes measured. A miss past the cap fails its first allocation with no peak.
QUAD_CAP = 444_491_366
QUADRATIC = quadratic(310.555e6, 4461.75, 11.64)
#: The same workload's tunes of 2026-12-01, since probes read each high-water mark with the mappings of its own
#: step: the static memory a probe measures lies 0.19 MB under the curve's intercept (1 MB before), so the
#: scout's own share at batch 8 (36 kB) is less than a process moves its peak. The least-squares quadratic
#: through eleven fits of two tunes, above the static memory (within 83 kB of each).
QUAD_STATIC = 310_368_000


@dataclass(frozen=True)
class QuadraticNow(Curve):
    """That quadratic, with the rising reading its probes made: 99.6 kB above the step's peak from a few hundred
    samples on, 60-180 kB under it at the smallest batches (the build's transients end earlier)."""

    peak: Curve

    def __call__(self, batch_size: int) -> int:
        return self.peak(batch_size)

    def rising(self, batch_size: int) -> int:
        return self.peak(batch_size) + (99_600 if batch_size >= 500 else -70_000)


QUADRATIC_NOW = QuadraticNow(quadratic(QUAD_STATIC + 186_951, 4244.32, 11.77))

#: ``scripts/workloads/param_heavy.py`` at 1 GiB, 2026-12-01 (three tunes): the rising reading is the
#: build's high-water mark at small batches, then 0.5322 MiB per sample (from 376 through 847 within 0.03 MiB
#: of the line); the step's peak is the optimizer step's, flat at 875.6 MiB, until the rising phase overtakes
#: it; a confirmation-length probe reads 0.27 MiB higher. What the probes measured as static: 680.89 MiB; the
#: tuner's floor 585.8 MiB; the search's line 3 MiB under the budget of 921.6 MiB.
PARAM_HEAVY_NOW = Measured(
    total=((875.55, 0.00175), (587.72, 0.5322)),
    long=((875.55, 0.00175), (587.99, 0.5322)),
    rise=((683.69, 0.25), (587.72, 0.5322)),
)
PH_STATIC_NOW = int(680.89 * MiB)
PH_FLOOR_NOW = 614_245_312

#: name: (curve, budget, the tuner's floor, the static memory a fit reports: for the synthetic curves a
#: little under their intercept, as a real probe's is under its peak's)
CURVES: dict[str, tuple[Curve, int, int, int]] = {
    "affine": (affine(300 * MiB, 1.5 * MiB), GiB, 0, 295 * MiB),
    "quadratic": (quadratic(300 * MiB, 0.2 * MiB, 0.002 * MiB), GiB, 0, 295 * MiB),
    "staircase": (staircase(300 * MiB, 1.3 * MiB, 20 * MiB), GiB, 0, 295 * MiB),
    "noisy affine (2 %)": (noisy(affine(300 * MiB, 1.5 * MiB), 0.02, seed=1), GiB, 0, 295 * MiB),
    "noisy affine (0.1 %)": (noisy(affine(600 * MiB, 0.53 * MiB), 0.001, seed=3), GiB, 0, 595 * MiB),
    "flat-then-rising": (plateau(900 * MiB, 100 * MiB, 0.5 * MiB), GiB, 0, 95 * MiB),
    "flat_rising (measured)": (FLAT_RISING, PH_BUDGET, PH_FLOOR, FLAT_STATIC),
    "param_heavy (measured)": (PARAM_HEAVY, PH_BUDGET, PH_FLOOR, PH_STATIC),
    "param_heavy bf16 (measured)": (PARAM_HEAVY_BF16, PH_BUDGET, PH_FLOOR, PH_STATIC),
    "quadratic (measured)": (QUADRATIC, QUAD_CAP - 3 * MiB, 309_516_176, 309_565_968),
    "param_heavy (2026-12-01)": (PARAM_HEAVY_NOW, PH_BUDGET, PH_FLOOR_NOW, PH_STATIC_NOW),
    "quadratic (2026-12-01)": (QUADRATIC_NOW, QUAD_CAP - 3 * MiB, QUAD_STATIC - 78_000, QUAD_STATIC),
}
#: The device's hard limit above the search's line, for the curves measured with one.
CAPS = {
    "quadratic (measured)": QUAD_CAP,
    "quadratic (2026-12-01)": QUAD_CAP,
    "param_heavy (2026-12-01)": PH_BUDGET + 3 * MiB,
}
#: The optimizer state a probe allocates after its first backward (the quadratic workload's is a few kB).
STATES = {"quadratic (measured)": 0, "quadratic (2026-12-01)": 0}
MEASURED = {"flat_rising (measured)", "param_heavy (measured)", "param_heavy bf16 (measured)", *CAPS}

#: (first combination, second combination, precision of the second): the grid's prior at work.
GRIDS: dict[str, tuple[str, Curve, str]] = {
    "affine, bf16 slope 0.7x": ("affine", affine(300 * MiB + 8 * MiB, 1.05 * MiB), "bf16-mixed"),
    "affine, bf16 slope 0.5x": ("affine", affine(300 * MiB + 8 * MiB, 0.75 * MiB), "bf16-mixed"),
    "param_heavy, bf16 (measured)": ("param_heavy (measured)", PARAM_HEAVY_BF16, "bf16-mixed"),
}
GRID_SHAPES = [(1024, 1024)]

#: The default grid in the tuner's order, each combination primed by every line measured before it: slopes
#: against 32-true without recomputation (a GPT on the CPU: bf16-mixed costs more than the typical 0.7x,
#: recomputation saves less than the typical 0.6x). Intercepts move by the autocast copies (2 bytes per
#: parameter, 1 M parameters).
GRID4 = {
    ("32-true", False): affine(300 * MiB, 1.5 * MiB),
    ("32-true", True): affine(300 * MiB, 1.5 * 0.75 * MiB),
    ("bf16-mixed", False): affine(302 * MiB, 1.5 * 0.95 * MiB),
    ("bf16-mixed", True): affine(302 * MiB, 1.5 * 0.95 * 0.75 * MiB),
}


def _probe(
    curve: Curve,
    budget: int,
    phases: bool,
    static: int | None = None,
    cap: int | None = None,
    state: int = PH_STATE,
) -> FakeStepProbe:
    fails = (lambda b, _p: curve.fails_long(b, budget)) if isinstance(curve, Measured) else None
    return FakeStepProbe(
        curve,
        budget,
        phases=phases,
        fails_long=fails,
        state_bytes=state,
        static_bytes=static,
        cap_bytes=cap,
    )


def _truth(curve: Curve, budget: int) -> int | None:
    if isinstance(curve, Measured):
        return true_max(lambda b: max(curve(b), _lines(curve.long, b)), budget, LIMITS.max_batch_size)
    return true_max(curve, budget, LIMITS.max_batch_size)


def count(
    curve: Curve,
    budget: int,
    floor: int,
    phases: bool,
    prediction: Prediction | None = None,
    static: int | None = None,
    cap: int | None = None,
    state: int = PH_STATE,
) -> tuple[int, bool, list[str], Affine | None]:
    probe = _probe(curve, budget, phases, static, cap, state)
    answer = find_maximum(probe, budget_bytes=budget, limits=LIMITS, prediction=prediction, floor_bytes=floor)
    exact = answer.max_batch_size == _truth(curve, budget)
    calls = [f"{b}{'(6+)' if steps == LIMITS.confirm else ''}" for b, steps, _ in probe.calls]
    return answer.probes, exact, calls, answer.model


def main() -> None:
    for phases, reports_static in ((False, False), (True, False), (True, True)):
        print(f"phase peaks reported: {phases}, static memory reported: {reports_static}")
        counts = []
        for name, (curve, budget, floor, static) in CURVES.items():
            if name in MEASURED and not phases:
                continue  # a real probe reports its rising phase
            probes, exact, calls, _ = count(
                curve,
                budget,
                floor,
                phases,
                static=static if reports_static else None,
                cap=CAPS.get(name),
                state=STATES.get(name, PH_STATE),
            )
            counts.append(probes)
            print(f"  {name:28s} {probes:3d} probes  exact={exact}  {' '.join(calls)}")
        print(f"  median {statistics.median(counts)}, max {max(counts)}")
    print("grid: the second combination, primed by the first's line (phase peaks reported)")
    for name, (first, second, precision) in GRIDS.items():
        curve, budget, floor, static = CURVES[first]
        _, _, _, model = count(curve, budget, floor, True, static=static)
        shapes = PH_SHAPES if "param_heavy" in name else GRID_SHAPES
        assert model is not None
        learned = [Learned.of(Combo("32-true", "adamw"), model)]
        prior = predict(Combo(precision, "adamw"), learned, shapes)
        probes, exact, calls, _ = count(second, budget, floor, True, prior)
        print(f"  {name:28s} {probes:3d} probes  exact={exact}  {' '.join(calls)}")
    print("the default grid (32-true, bf16-mixed) x (recompute off, on), each primed by the lines before it")
    grid4()
    print(
        f"{NOISY_TUNES} seeded tunes each: the tune's baseline within 1 MiB, each probe's process within the "
        "noise more, a confirmation-length probe 0.13 MiB higher"
    )
    for name in NOISY:
        for mib in (0.0, 0.2, 0.4):
            counts, offsets = noisy_tunes(name, mib)
            spread = " ".join(f"{c}:{counts.count(c)}" for c in sorted(set(counts)))
            print(
                f"  {name:24s} noise {mib:.1f} MiB: median {statistics.median(counts)}, mean "
                f"{statistics.mean(counts):.2f}, max {max(counts)}, over 6: {sum(c > 6 for c in counts)}  "
                f"(probes:tunes {spread}); answer less the tune's maximum {min(offsets)} to {max(offsets)}"
            )


#: Seeded tunes per curve and level of noise between processes.
NOISY_TUNES = 100
NOISY = ("quadratic (measured)", "quadratic (2026-12-01)", "param_heavy (2026-12-01)")
#: How much higher a probe as long as a confirmation peaks, per curve (else 0.13 MiB, the quadratic
#: workload's): param_heavy's 6-step fit at 621 read 0.27 MiB above the line through its 3-step readings.
LONG = {"param_heavy (2026-12-01)": int(0.27 * MiB)}


def noisy_tunes(name: str, noise_mib: float) -> tuple[list[int], list[int]]:
    """Probes per tune of a measured curve, its processes' memory moving (:class:`ProcessNoise`), and each
    answer less the maximum of the curve moved by the tune's own baseline (a probe's process moves it more)."""
    curve, budget, floor, static = CURVES[name]
    counts, offsets = [], []
    for seed in range(NOISY_TUNES):
        long = LONG.get(name, int(0.13 * MiB))
        noise = ProcessNoise(MiB, int(noise_mib * MiB), long, seed)
        probe = _probe(curve, budget, True, static, CAPS.get(name), STATES.get(name, PH_STATE))
        probe.noise, probe.fails_long = noise, None
        answer = find_maximum(probe, budget_bytes=budget, limits=LIMITS, floor_bytes=floor)
        counts.append(answer.probes)
        shift = noise.tune_offset + long
        truth = true_max(lambda b, shift=shift: curve(b) + shift, budget, LIMITS.max_batch_size)
        offsets.append((answer.max_batch_size or 0) - (truth or 0))
    return counts, offsets


def grid4() -> None:
    """The whole default grid, as the tuner runs it: probes per combination."""
    learned: list[Learned] = []
    counts = []
    for (precision, recompute), curve in GRID4.items():
        prior = predict(Combo(precision, "adamw", "full" if recompute else "off"), learned, GRID_SHAPES)
        probe = _probe(curve, GiB, True, 295 * MiB)
        answer = find_maximum(probe, budget_bytes=GiB, limits=LIMITS, prediction=prior)
        assert answer.max_batch_size == _truth(curve, GiB) and answer.model is not None
        learned.append(Learned.of(Combo(precision, "adamw", "full" if recompute else "off"), answer.model))
        counts.append(answer.probes)
        calls = " ".join(f"{b}{'(6+)' if st == LIMITS.confirm else ''}" for b, st, _ in probe.calls)
        print(f"  {precision}/{'rc' if recompute else 'no-rc':5s} {answer.probes:3d} probes  {calls}")
    print(f"  grid: {sum(counts)} probes, {sum(counts) / len(counts):.2f} per combination")


TITLE = "Probes per curve"
INTRO = (
    "How many probes the per-combination procedure (`autobatch/core/maximum.py`: calibrate, search, "
    "confirm) makes on synthetic memory curves, and whether its answer is the true maximum: fake probes, "
    "no torch, seconds (`python scripts/probe_counts.py`). Each line: the curve, the probes it took "
    "(its confirmation included), whether the answer was exact, and the batches probed in order (`(6+)`: a "
    "probe of confirmation length, six steps at least and up to ten while its peak grows). Two curves follow real tunes of `scripts/workloads/param_heavy.py` (CPU, 1 GiB), one of `scripts/workloads/flat_rising.py`, and one of `tests/scripts/quadratic.py` (CPU, 471 MiB, a cap past which a miss fails at once); the last section runs that curve with each probe's process "
    "moving its memory, as processes do, over seeded tunes. The "
    "sections turn on what a real probe reports: the rising phase's peak, then the static memory too."
)


def write_page(argv: list[str]) -> None:
    """Run :func:`main`, print its output and write it to the page (``--no-write``: print only, as for trying an
    idea before it goes in)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-write", action="store_true", help="print the tables; leave the page as it is")
    args = parser.parse_args(argv)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main()
    text = out.getvalue()
    print(text, end="")
    if args.no_write:
        return
    head = measurements.run_header(measurements.command_line("probe_counts.py", argv))
    lines = ["## Latest run", "", *head, "", "```text", *text.rstrip("\n").splitlines(), "```"]
    measurements.update(
        measurements.PAGES / "probe-counts.md", "probe-counts", lines, title=TITLE, intro=INTRO
    )


if __name__ == "__main__":
    write_page(sys.argv[1:])
