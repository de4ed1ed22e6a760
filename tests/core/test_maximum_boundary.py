"""Probe counts near the boundary on the shapes real tunes met: a convex curve, a model a few samples high.

Each test replays, on a synthetic curve, what a real tune's probes reported (peaks, rising readings, static
memory, misses that stop at the line) and counts the probes the whole procedure makes, confirmation included.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from autobatch.core.maximum import Limits, find_maximum
from autobatch.core.search import Observation
from autobatch.testing import Curve, FakeStepProbe, QuadraticCurve, affine, true_max

MiB = 2**20
LIMITS = Limits(max_batch_size=65536, batch_multiple=1, steps=3, max_steps=8, confirm_steps=10)


@dataclass(frozen=True)
class Floored(Curve):
    """``curve`` under a floor: the process's own memory, which a small batch's step reuses."""

    floor: float
    curve: Curve

    def __call__(self, batch_size: int) -> int:
        return max(math.ceil(self.floor), self.curve(batch_size))


#: ``tests/scripts/quadratic.py`` on the CPU (2026-11-28): 308.5 MiB at batch 8 and 300, 379.4 at 2367, 415.4
#: at 2937, 420.9 at 3014, which fits the cap's 423.9 MiB less the 3 MiB margin; 3015 does not.
CONTRASTIVE = Floored(308.5 * MiB, QuadraticCurve(309 * MiB, 0.0028 * MiB, 1.138e-5 * MiB))
CONTRASTIVE_LINE = int(420.9 * MiB)


def calls(probe: FakeStepProbe | StopsAtTheLine) -> list[str]:
    return [f"{b}{'(6+)' if steps == LIMITS.confirm else ''}" for b, steps, _ in probe.calls]


def test_a_batch_by_batch_loss_is_searched_along_its_bend() -> None:
    # Before: 8 218 20834(6+) 2131 4708 3710 2920 3028 2974 3015(6+) 3016(6+): the line through the fits
    # overshot the convex curve twice; the parabola through 8, 218 and 2131 puts the maximum at 3015. Then
    # 8 218 20834(6+) 2131 4272 3015 3016(6+) 3015(6+): the parabola set only the interval's low end, and a step
    # there had to cut the bisection's count, so the search probed the line's end (4272) first. Then the
    # parabola's answer was probed first, as long as a confirmation, after 20834, where the line through 8 and 218
    # put the boundary (95 times the larger fit: it failed at once). Now a line that reaches more than
    # search.FAR_REACH (2.5) times past its larger fit is tested at the geometric middle first.
    probe = FakeStepProbe(
        CONTRASTIVE, CONTRASTIVE_LINE, phases=True, state_bytes=MiB // 10, static_bytes=305 * MiB
    )
    answer = find_maximum(probe, budget_bytes=CONTRASTIVE_LINE, limits=LIMITS)
    assert answer.max_batch_size == true_max(CONTRASTIVE, CONTRASTIVE_LINE, LIMITS.max_batch_size) == 3015
    assert calls(probe) == ["8", "218", "2131", "3015(6+)", "3016(6+)"]


@dataclass
class StopsAtTheLine:
    """A probe over an affine curve whose fits read up to ``low`` samples under their peak (a seeded draw per
    batch) and whose misses stop just past the line, with the rising phase's reading read as low: the
    full recomputation of the levels' tune (97 out of memory, 90 fits, then 93, 92 and 91 out of memory)."""

    curve: Curve
    line: int
    low: float
    seed: int
    calls: list[tuple[int, tuple[int, int], str]] = field(default_factory=list)

    def __call__(self, batch_size: int, steps: tuple[int, int], purpose: str) -> Observation:
        self.calls.append((batch_size, steps, purpose))
        draw = random.Random(self.seed * 7919 + batch_size)
        slope = self.curve(1001) - self.curve(1000)
        reading = int(self.curve(batch_size) - draw.uniform(0, self.low) * slope)
        if self.curve(batch_size) > self.line:
            stop = self.line + draw.randint(1, MiB // 4)
            return Observation(batch_size, False, peak_bytes=stop, steps=1, rising_bytes=reading)
        return Observation(
            batch_size, True, peak_bytes=reading, steps=steps[0], rising_bytes=reading, static_bytes=298 * MiB
        )


def test_a_model_a_few_samples_high_falls_back_to_bisecting_the_whole_bracket_less_often() -> None:
    # Before, per seed: 8 12 11 10 4 11 12 4 4 11 7 7 probes (101). Two misses a candidate apart spent the
    # model's slack, and the search bisected from the scout: 8 117 92(6+) 91(6+) 49 70 80 85 88 89 90(6+).
    # Three such misses still do (seed 6: 8 119 93 92 91, then the bisection, 12 probes).
    curve, line = affine(300 * MiB, 3 * MiB), int((300 + 3 * 90 + 1.5) * MiB)
    counts = []
    for seed in range(12):
        probe = StopsAtTheLine(curve, line, low=3, seed=seed)
        answer = find_maximum(probe, budget_bytes=line, limits=LIMITS)
        assert answer.max_batch_size == 90, calls(probe)
        counts.append(answer.probes)
        if seed == 9:
            assert calls(probe) == ["8", "117", "92(6+)", "91(6+)", "90(6+)"]
    assert sum(counts) <= 77, counts
